"""Compiled row reductions that round exactly like the numpy/BLAS calls of ``metrics``.

Why they exist: ``compare`` must give the same bits whatever path computes them (a relative
error that moves in its last bit can flip a verdict on its limit; the pinned-metrics test
holds every number). The numpy path reduces each row with about 25 numpy calls from cache;
these kernels do the same arithmetic *in the same order* in one compiled loop per row, with
the GIL released, so the threads of ``tiled_scan`` scale.

Each float sum copies the order of the call it replaces:

- dot products (``block_sums``, ``dot_diff``): OpenBLAS's ``ddot`` as numpy's ``vecdot``
  calls it. Which kernel that is depends on the CPU OpenBLAS finds at run time, so each
  kernel's order is an ``order`` argument (``DDOT_ORDERS``):

  - ``SKYLAKEX`` (AVX-512 boxes, AMX Xeons: ``kernel/x86_64/ddot_microk_skylakex-2.c``): 32
    lanes (four 8-wide accumulators, fused multiply-add) over the first ``n & ~31`` elements,
    folded to 16 lanes, 16 lanes over the rest of ``n & -16``, lanes summed
    ``((l0+l1)+l2)+l3`` per quarter then ``(q0+q2)+(q1+q3)``, the last ``n % 16`` elements
    added one by one with a fused multiply-add.
  - ``HASWELL`` (AVX2-only boxes, Zen 1-3: ``ddot_microk_haswell-2.c``): 16 lanes (four
    4-wide accumulators, fused multiply-add) over ``n & -16``; each register's upper half
    added to its lower, the four halves summed ``(h0+h1)+(h2+h3)``, the pair by ``hadd``;
    the last ``n % 16`` elements added one by one, product rounded before the add (the C
    tail is not contracted).
- ``pairwise``: numpy's pairwise sum (``loops_utils.h``): blocks of at most 128 summed with 8
  accumulators, longer runs split at half rounded down to a multiple of 8; numpy's row
  reduction adds the result to its identity 0.0.

Other CPUs may pick yet other OpenBLAS kernels, so ``aligntools.analyzer.metrics`` checks
each order against numpy on probe rows before it uses one, and falls back to numpy where
none agrees. Maxima and counts are exact in any order.

Vectorizing without reordering: every accumulator is a *lane* of a small scratch array
updated in the order above; the compiler turns the lane loops into SIMD instructions without
reassociating any sum (only ``contract``, i.e. FMA, is allowed, as the BLAS kernel uses it).
"""

from __future__ import annotations

import numpy as np

from aligntools.numba_vllm_compat import numba

njit = numba.njit

JIT = {"nogil": True, "cache": True, "fastmath": {"contract"}, "error_model": "numpy", "boundscheck": False}
"""``contract`` only: products fused into adds like the BLAS kernel, never reassociated."""

LANES = 32
"""Lanes of the widest accumulator (the BLAS kernel's four 8-wide registers)."""

PAIRWISE_BLOCK = 128
"""numpy's ``PW_BLOCKSIZE``: runs up to this long are summed with 8 accumulators."""

_SIGN = np.int32(-(1 << 31))

ZERO = 0.0
"""Passed as the kernels' ``zero`` argument (``_add_product``): a run-time 0.0."""

SKYLAKEX, HASWELL = 0, 1
DDOT_ORDERS = {"skylakex": SKYLAKEX, "haswell": HASWELL}
"""OpenBLAS ddot kernels whose summation order the kernels copy (name -> ``order`` argument)."""


@njit(inline="always", **JIT)
def _add_product(s: float, a: float, b: float, zero: float) -> float:
    """s + a * b with the product rounded before the add (the Haswell kernel's C tail).

    Numba compiles a callee with its caller's ``contract``, so flags cannot keep the two
    apart, and a literal ``+ 0.0`` is dropped where the compiler proves the product is not
    -0 (``d * d``). ``zero`` is the caller's argument ``ZERO``, a value it cannot see: the
    product is added to it first (fused or not, that is the rounded product; a -0 product
    becomes +0, which changes no sum: the tail's running sum starts at +0 and
    round-to-nearest never makes -0), and only then to ``s``."""
    return s + (a * b + zero)


@njit(inline="always", **JIT)
def _fold(acc: np.ndarray, n32: int) -> None:
    """Fold the 32 lanes (four 512-bit registers) to 16 (four 256-bit ones): lane l of
    register k becomes acc[8k + l] + acc[8k + l + 4]; zeros when no 32-block ran."""
    for j in range(16):
        k, lane = j // 4, j % 4
        acc[j] = acc[8 * k + lane] + acc[8 * k + lane + 4] if n32 else 0.0


@njit(inline="always", **JIT)
def _total(acc: np.ndarray, order: int) -> float:
    """The 16 lanes summed as the ``order``'s kernel does. SKYLAKEX: per 256-bit lane
    ((r0 + r1) + r2) + r3, then the 128-bit halves added and the pair summed by ``hadd``.
    HASWELL: per register [l0 + l2, l1 + l3], the registers (h0 + h1) + (h2 + h3), the pair
    by ``hadd``."""
    if order == HASWELL:
        h0 = ((acc[0] + acc[2]) + (acc[4] + acc[6])) + ((acc[8] + acc[10]) + (acc[12] + acc[14]))
        h1 = ((acc[1] + acc[3]) + (acc[5] + acc[7])) + ((acc[9] + acc[11]) + (acc[13] + acc[15]))
        return h0 + h1
    s0 = ((acc[0] + acc[4]) + acc[8]) + acc[12]
    s1 = ((acc[1] + acc[5]) + acc[9]) + acc[13]
    s2 = ((acc[2] + acc[6]) + acc[10]) + acc[14]
    s3 = ((acc[3] + acc[7]) + acc[11]) + acc[15]
    return (s0 + s2) + (s1 + s3)


@njit(inline="always", **JIT)
def _wide_end(n16: int, order: int) -> int:
    """End of the 32-lane loop: the SKYLAKEX kernel's ``n & ~31``; HASWELL has none."""
    return n16 & ~31 if order == SKYLAKEX else 0


@njit(**JIT)
def block_sums(xa: np.ndarray, xb: np.ndarray, permille: float, acc: np.ndarray, out: np.ndarray,
               absd: np.ndarray, lanes: np.ndarray, cnt: np.ndarray, top: np.ndarray, order: int,
               zero: float) -> None:
    """One visit of float32 rows xa, xb [n] widened to float64, d = b - a:

    - out = (a.a, b.b, a.b, d.d), each in the ``order``'s ``ddot`` order (acc: [4, 32] scratch);
    - |d| into ``absd`` [n], and per lane (added to, not reset: a row may be several blocks)
      max |d| (``lanes`` float64 [32]), the count of |d| > permille * |a| (``cnt``) and the
      max fp32-ordinal distance (``top``, int64 [32]) - exact in any order.
    """
    n = xa.shape[0]
    n16 = n & -16
    n32 = _wide_end(n16, order)
    acc[:] = 0.0
    ia, ib = xa.view(np.int32), xb.view(np.int32)
    for i in range(0, n32, LANES):
        for j in range(LANES):
            _visit(xa, xb, ia, ib, i + j, j, permille, acc, absd, lanes, cnt, top)
    for q in range(4):
        _fold(acc[q], n32)
    for i in range(n32, n16, 16):
        for j in range(16):
            _visit(xa, xb, ia, ib, i + j, j, permille, acc, absd, lanes, cnt, top)
    for q in range(4):
        total = _total(acc[q], order)
        acc[q, 0] = total  # the kernel's scalar result, to which the tail is added one by one
    if order == HASWELL:
        for i in range(n16, n):
            _visit_unfused(xa, xb, ia, ib, i, permille, acc, absd, lanes, cnt, top, zero)
    else:
        for i in range(n16, n):
            _visit(xa, xb, ia, ib, i, 0, permille, acc, absd, lanes, cnt, top)
    out[:] = acc[:, 0]


@njit(inline="always", **JIT)
def _visit(xa: np.ndarray, xb: np.ndarray, ia: np.ndarray, ib: np.ndarray, i: int, lane: int, permille: float,
           acc: np.ndarray, absd: np.ndarray, lanes: np.ndarray, cnt: np.ndarray, top: np.ndarray) -> None:
    """Element i of ``block_sums`` into accumulator lane ``lane``."""
    a, b, x, over, dist = _terms(xa[i], xb[i], ia[i], ib[i], permille)
    d = b - a
    acc[0, lane] += a * a
    acc[1, lane] += b * b
    acc[2, lane] += a * b
    acc[3, lane] += d * d
    absd[i] = x
    lanes[lane] = x if x > lanes[lane] else lanes[lane]
    cnt[lane] += over
    top[lane] = dist if dist > top[lane] else top[lane]


@njit(inline="always", **JIT)
def _visit_unfused(xa: np.ndarray, xb: np.ndarray, ia: np.ndarray, ib: np.ndarray, i: int, permille: float,
                   acc: np.ndarray, absd: np.ndarray, lanes: np.ndarray, cnt: np.ndarray, top: np.ndarray,
                   zero: float) -> None:
    """``_visit`` of a tail element into lane 0, each product rounded before its add."""
    a, b, x, over, dist = _terms(xa[i], xb[i], ia[i], ib[i], permille)
    d = b - a
    acc[0, 0] = _add_product(acc[0, 0], a, a, zero)
    acc[1, 0] = _add_product(acc[1, 0], b, b, zero)
    acc[2, 0] = _add_product(acc[2, 0], a, b, zero)
    acc[3, 0] = _add_product(acc[3, 0], d, d, zero)
    absd[i] = x
    lanes[0] = x if x > lanes[0] else lanes[0]
    cnt[0] += over
    top[0] = dist if dist > top[0] else top[0]


@njit(inline="always", **JIT)
def _terms(fa: np.float32, fb: np.float32, ba: np.int32, bb: np.int32,
           permille: float) -> tuple[float, float, float, bool, np.int64]:
    """a, b widened; |b - a|; whether it exceeds permille * |a|; the distance of the fp32
    ordinals (bits ^ 0x80000000 for x >= +0, ~bits for x <= -0: monotone in the value,
    adjacent floats 1 apart)."""
    a = np.float64(fa)
    b = np.float64(fb)
    x = abs(b - a)
    oa = np.int64(ba ^ ((ba >> 31) | _SIGN)) & 0xFFFFFFFF
    ob = np.int64(bb ^ ((bb >> 31) | _SIGN)) & 0xFFFFFFFF
    return a, b, x, x > abs(a) * permille, abs(oa - ob)


@njit(**JIT)
def dot_diff(t: np.ndarray, xa: np.ndarray, xb: np.ndarray, acc: np.ndarray, order: int, zero: float) -> float:
    """t . (xb - xa) of a float64 row t [n] and float32 rows xa, xb [n] widened, in the
    ``order``'s ``ddot`` order. acc: [32] scratch."""
    n = t.shape[0]
    n16 = n & -16
    n32 = _wide_end(n16, order)
    acc[:] = 0.0
    for i in range(0, n32, LANES):
        for j in range(LANES):
            acc[j] += t[i + j] * (np.float64(xb[i + j]) - np.float64(xa[i + j]))
    _fold(acc, n32)
    for i in range(n32, n16, 16):
        for j in range(16):
            acc[j] += t[i + j] * (np.float64(xb[i + j]) - np.float64(xa[i + j]))
    out = _total(acc, order)
    if order == HASWELL:
        for i in range(n16, n):
            out = _add_product(out, t[i], np.float64(xb[i]) - np.float64(xa[i]), zero)
    else:
        for i in range(n16, n):
            out += t[i] * (np.float64(xb[i]) - np.float64(xa[i]))
    return out


@njit(**JIT)
def _pairwise_leaf(x: np.ndarray, lo: int, n: int) -> float:
    """numpy's sum of a run x[lo:lo+n] of at most 128 elements: 8 accumulators (locals, so
    they stay in registers), combined ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the
    last n % 8 elements one by one. Each step reads an 8-element view at constant indices:
    no negative-index wraparound for LLVM to keep, 1.8x faster than x[i + k] (same bits)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += x[i]
        return res
    v = x[lo:lo + 8]
    r0, r1, r2, r3, r4, r5, r6, r7 = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    m = n - n % 8
    for i in range(lo + 8, lo + m, 8):
        v = x[i:i + 8]
        r0 += v[0]
        r1 += v[1]
        r2 += v[2]
        r3 += v[3]
        r4 += v[4]
        r5 += v[5]
        r6 += v[6]
        r7 += v[7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(lo + m, lo + n):
        res += x[i]
    return res


@njit(**JIT)
def pairwise(x: np.ndarray, left: np.ndarray, stack: np.ndarray) -> float:
    """numpy's ``x.sum()`` of a float64 vector [n] (0.0 + pairwise sum). The recursion
    sum(lo, n) = sum(lo, h) + sum(lo + h, n - h) is walked with an explicit stack (numba's
    cached code cannot recurse). left: float64 [>= 32] scratch for the sums of frames
    waiting for their right half (one per level); stack: int64 [64, 3] scratch."""
    top = 0
    stack[0, 0], stack[0, 1], stack[0, 2] = 0, x.shape[0], 0  # lo, n, state (0 new, 1 left done)
    v = 0.0
    have = False
    while True:
        lo, n = stack[top, 0], stack[top, 1]
        if not have:
            if n <= PAIRWISE_BLOCK:
                v = _pairwise_leaf(x, lo, n)
                have = True
            else:
                h = n // 2
                h -= h % 8
                stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = lo, h, 0
                top += 1
            continue
        top -= 1
        if top < 0:
            return 0.0 + v
        lo, n = stack[top, 0], stack[top, 1]
        if stack[top, 2] == 0:  # left half done: remember it, do the right half
            h = n // 2
            h -= h % 8
            left[top] = v
            stack[top, 2] = 1
            stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = lo + h, n - h, 0
            top += 1
            have = False
        else:
            v = left[top] + v


@njit(**JIT)
def row_sums_fp32(xa: np.ndarray, xb: np.ndarray, k: int, permille: float, scratch: np.ndarray,
                  iscratch: np.ndarray, out: np.ndarray, order: int, zero: float) -> bool:
    """``metrics.ROW_SUMS`` of float32 rows xa, xb [r, n] into out [8, r] (sum_d2, sum_a2,
    sum_b2, sum_ab, sum_absd, max_absd, n_rel, max_ulp), bit for bit what the numpy path
    gives. k: the dot block (``metrics._dot_block``): a row's dots are the pairwise sums of
    its blocks' dots when k < n; order: a ``DDOT_ORDERS`` value; zero: ``ZERO``. Returns
    False, leaving out partly written, as soon as a row holds NaN/Inf: such chunks take the
    numpy path, which masks them.

    scratch: float64 [n + 4 (n // k) + 192] (|d|, block dots, accumulators, lanes);
    iscratch: int64 [256].
    """
    rows, n = xa.shape
    nb = n // k
    absd, parts = scratch[:n], scratch[n:n + 4 * nb].reshape(4, nb)
    acc, lanes = scratch[n + 4 * nb:n + 4 * nb + 4 * LANES].reshape(4, LANES), scratch[n + 4 * nb + 4 * LANES:]
    cnt, top, stack = iscratch[:LANES], iscratch[LANES:2 * LANES], iscratch[2 * LANES:].reshape(-1, 3)
    sums = np.empty(4)
    for r in range(rows):
        lanes[:] = 0.0
        cnt[:] = 0
        top[:] = 0
        for j in range(nb):
            cols = slice(j * k, (j + 1) * k)
            block_sums(xa[r, cols], xb[r, cols], permille, acc, sums, absd[cols], lanes, cnt, top, order, zero)
            for q in range(4):
                parts[q, j] = 0.0 + sums[q]
        if nb > 1:
            for q in range(4):
                sums[q] = pairwise(parts[q], lanes[LANES:], stack)
        else:
            sums[:] = parts[:, 0]
        if not (np.isfinite(sums[0]) and np.isfinite(sums[1])):  # squares of fp32 never overflow float64
            return False
        out[0, r], out[1, r], out[2, r], out[3, r] = sums[3], sums[0], sums[1], sums[2]
        out[5, r], out[6, r], out[7, r] = lanes[:LANES].max(), cnt.sum(), top.max() / 65536.0
        out[4, r] = pairwise(absd, lanes[LANES:], stack)
    return True


@njit(**JIT)
def diff_dots(ez: np.ndarray, xa: np.ndarray, xb: np.ndarray, k: int, scratch: np.ndarray,
              out: np.ndarray, order: int, zero: float) -> None:
    """out[r] = ``metrics._rowdot`` of ez[r] (float64) and xb[r] - xa[r] (float32 rows
    widened): the logits' sum p_a (x_b - x_a). scratch as ``row_sums_fp32``'s."""
    n = xa.shape[1]
    nb = n // k
    parts, acc = scratch[:nb], scratch[nb:nb + LANES]
    stack = np.empty((64, 3), np.int64)
    for r in range(xa.shape[0]):
        for j in range(nb):
            cols = slice(j * k, (j + 1) * k)
            parts[j] = 0.0 + dot_diff(ez[r, cols], xa[r, cols], xb[r, cols], acc, order, zero)
        out[r] = pairwise(parts, acc, stack) if nb > 1 else parts[0]


@njit(**JIT)
def shift_rows(x: np.ndarray, top: np.ndarray, ez: np.ndarray) -> np.ndarray:
    """ez[r] = x[r] - m[r] in float64 for float32 rows x [r, V], m[r] = x[r, top[r]] (the row
    max; 0 where not finite): the argument of the softmax's exp. Returns m [r]."""
    rows, n = x.shape
    m = np.empty(rows)
    for r in range(rows):
        mr = np.float64(x[r, top[r]])
        if not np.isfinite(mr):
            mr = 0.0
        m[r] = mr
        for i in range(n):
            ez[r, i] = np.float64(x[r, i]) - mr
    return m


@njit(**JIT)
def row_pairwise(x: np.ndarray, out: np.ndarray) -> None:
    """out[r] = numpy's ``x.sum(axis=1)`` of float64 rows x [r, n]."""
    acc = np.empty(LANES)
    stack = np.empty((64, 3), np.int64)
    for r in range(x.shape[0]):
        out[r] = pairwise(x[r], acc, stack)
