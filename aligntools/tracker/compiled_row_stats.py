"""min, max, float64 sum, l2 norm and row hash of float32 rows in one compiled pass, bit for
bit torch's sums and ``row_hash``'s definition.

Why: stats mode's float64 sums cost a float64 copy of every row block plus a pass each for
the sum, the norm, the min and the max (~8 ms of a ~110 ms forward at hidden 512). A float
sum depends on its order, so this kernel replays torch's order exactly instead of choosing
its own, as measured on this torch build (CPU, float64 of float32 rows, reduced over the
last dim; one thread per row, which is torch's order for every row here, see
``reduce_rows``):

- ``sum(1)``: ``cascade_sum`` / ``vectorized_inner_sum``: vectors of ``_LANES`` doubles
  gathered by ``_ILP`` independent accumulators, promoted through ``_LEVELS`` levels every
  ``2**bits`` steps, folded, then the tail elements, then the lanes, then added to 0.0;
- ``linalg.vector_norm(dim=1)``: one ``_LANES``-wide accumulator of squares, lanes folded
  left to right, then the tail, then ``sqrt`` (squares of float32 values are exact in
  float64, so fused multiply-adds would give the same bits).

``stats._kernel_agrees`` checks all four against torch on awkward rows once per process; a
build that reduces in another order keeps torch's path (``stats.reduce_rows``). min/max are
exact in any order except for the sign of a zero, so where a min or max is zero torch's are
taken. Measured at hidden 512 (41 sites, 13 M values): ~5 ms instead of ~8 ms, on one
thread (two threads over the rows were slower: the handoff costs more than half a pass).

The row hash (``row_hash``: two NH sums, integers modulo 2**64, so any order gives the same
value) runs on each row right after its sums, while the row is in L1: ~2.3 ms at hidden 512
where a separate int8 GEMM over the same bytes took ~4.8 ms. Its compiled code lives here,
beside the pass that inlines it, so numba's on-disk cache (invalidated per source file)
never keeps a fused kernel built from an older hash. For the same reason its moduli ``P1``,
``P2`` are written here, where numba bakes them in, as well as in ``row_hash`` (whose torch path
must not import numba); ``tests/aligntools/tracker/test_row_hash.py`` checks that they are equal
and that every path computes the definition.

This module imports numba, so it is imported only where it runs (``row_hash.COMPILED_MIN``).

Vectors are tuples of 4 floats, so LLVM keeps them in registers; its SLP vectorizer,
which numba leaves off by default, turns them into vector instructions (4x faster here).
It is switched on only while this module's kernel compiles, under numba's compiler lock;
numba's on-disk cache keeps the compiled code (a ~0.2 s load after the first process).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch
from numba.core import config as numba_config
from numba.core.compiler_lock import global_compiler_lock

from aligntools.numba_vllm_compat import numba

_LANES, _ILP, _LEVELS, _MIN_BITS = 4, 4, 4, 4  # torch: Vectorized<double> here, ilp_factor, num_levels, level power
ZERO_MIN_MAX, NONFINITE_SUM = 1, 2  # row_sums' flags
P1, P2 = 2_147_483_647, 2_097_143  # row_hash.P1, row_hash.P2 (module docstring: why twice)
_M32, _P1, _P2, _SHIFT = np.uint64(0xFFFFFFFF), np.uint64(P1), np.uint64(P2), np.uint64(21)


@numba.njit(inline="always")
def _vadd(u, v):
    return (u[0] + v[0], u[1] + v[1], u[2] + v[2], u[3] + v[3])


@numba.njit(inline="always")
def _load(row, i):
    """One vector: 4 float32 values from ``i``, widened."""
    return (np.float64(row[i]), np.float64(row[i + 1]), np.float64(row[i + 2]), np.float64(row[i + 3]))


@numba.njit(inline="always")
def _add_ilp(acc, b):
    """One accumulator level (``_ILP`` vectors) plus another."""
    return (_vadd(acc[0], b[0]), _vadd(acc[1], b[1]), _vadd(acc[2], b[2]), _vadd(acc[3], b[3]))


@numba.njit(inline="always")
def _row_sum(row, bits):
    """torch's float64 ``sum`` of one float32 row (``cascade_sum``, see the module docstring).

    Level 0 is four separate vectors (the hot loop; LLVM keeps them in registers), the
    upper levels are tuples of four vectors, updated once every ``2**bits`` steps.
    """
    d = len(row)
    vec = d // _LANES
    per_ilp = vec // _ILP
    step, mask = 1 << bits, (1 << bits) - 1
    z4 = (0.0, 0.0, 0.0, 0.0)
    a0, a1, a2, a3 = z4, z4, z4, z4  # level 0
    l1 = l2 = l3 = (z4, z4, z4, z4)
    i = 0
    while i + step <= per_ilp:
        for _ in range(step):
            b = i * _ILP * _LANES
            a0, a1 = _vadd(a0, _load(row, b)), _vadd(a1, _load(row, b + 4))
            a2, a3 = _vadd(a2, _load(row, b + 8)), _vadd(a3, _load(row, b + 12))
            i += 1
        l1 = _add_ilp(l1, (a0, a1, a2, a3))
        a0, a1, a2, a3 = z4, z4, z4, z4
        if (i & (mask << bits)) == 0:
            l2, l1 = _add_ilp(l2, l1), (z4, z4, z4, z4)
            if (i & (mask << (2 * bits))) == 0:
                l3, l2 = _add_ilp(l3, l2), (z4, z4, z4, z4)
    while i < per_ilp:
        b = i * _ILP * _LANES
        a0, a1 = _vadd(a0, _load(row, b)), _vadd(a1, _load(row, b + 4))
        a2, a3 = _vadd(a2, _load(row, b + 8)), _vadd(a3, _load(row, b + 12))
        i += 1
    acc = _add_ilp(l3, _add_ilp(l2, _add_ilp(l1, (a0, a1, a2, a3))))
    p = acc[0]
    for v in range(per_ilp * _ILP, vec):
        p = _vadd(p, _load(row, v * _LANES))
    p = _vadd(_vadd(_vadd(p, acc[1]), acc[2]), acc[3])
    s = 0.0
    for t in range(vec * _LANES, d):
        s += np.float64(row[t])
    s = s + p[0] + p[1] + p[2] + p[3]
    return 0.0 + s


@numba.njit(inline="always")
def _vmin(u, v):
    return (min(u[0], v[0]), min(u[1], v[1]), min(u[2], v[2]), min(u[3], v[3]))


@numba.njit(inline="always")
def _vmax(u, v):
    return (max(u[0], v[0]), max(u[1], v[1]), max(u[2], v[2]), max(u[3], v[3]))


@numba.njit(inline="always")
def _raw(row, i):
    return (row[i], row[i + 1], row[i + 2], row[i + 3])


@numba.njit(inline="always")
def _squares(v):
    w = (np.float64(v[0]), np.float64(v[1]), np.float64(v[2]), np.float64(v[3]))
    return (w[0] * w[0], w[1] * w[1], w[2] * w[2], w[3] * w[3])


@numba.njit(inline="always")
def _norm_min_max(x, r, l2, mn, mx, vec):
    """torch's norm of row ``r`` (one lane accumulator, lanes folded left to right, the tail,
    sqrt), and its min and max (exact in any order)."""
    row = x[r]
    inf = np.float32(np.inf)
    acc, lo, hi = (0.0, 0.0, 0.0, 0.0), (inf, inf, inf, inf), (-inf, -inf, -inf, -inf)
    for t in range(0, vec * _LANES, _LANES):
        v = _raw(row, t)
        acc, lo, hi = _vadd(acc, _squares(v)), _vmin(lo, v), _vmax(hi, v)
    b = acc[0] + acc[1] + acc[2] + acc[3]
    a, z = min(min(lo[0], lo[1]), min(lo[2], lo[3])), max(max(hi[0], hi[1]), max(hi[2], hi[3]))
    for t in range(vec * _LANES, len(row)):
        w = np.float64(row[t])
        b += w * w
        a, z = min(a, row[t]), max(z, row[t])
    l2[r], mn[r], mx[r] = np.sqrt(b), a, z


@numba.njit(inline="always")
def nh_sums(m, keys):
    """The two NH sums (uint64, mod 2**64) of one row of words ``m`` [W] uint32 with
    ``keys`` [4, ceil(W / 2)] uint32 (rows: kA0, kA1, kB0, kB1; uint32, not uint64: the
    keys are read as often as the row, and half the bytes made the loop 1.3x faster)."""
    h = len(m) // 2
    a, b = np.uint64(0), np.uint64(0)
    for i in range(h):  # (written so that LLVM vectorizes it: 3-4x faster than other forms)
        lo, hi = np.uint64(m[i]), np.uint64(m[i + h])
        a += ((lo + np.uint64(keys[0, i])) & _M32) * ((hi + np.uint64(keys[1, i])) & _M32)
        b += ((lo + np.uint64(keys[2, i])) & _M32) * ((hi + np.uint64(keys[3, i])) & _M32)
    if len(m) % 2:  # odd W: the last word's partner is a zero word
        lo = np.uint64(m[2 * h])
        a += ((lo + np.uint64(keys[0, h])) & _M32) * np.uint64(keys[1, h])
        b += ((lo + np.uint64(keys[2, h])) & _M32) * np.uint64(keys[3, h])
    return a, b


@numba.njit(inline="always")
def fold(a, b):
    """Two NH sums -> the 52-bit hash, as float64 (exact)."""
    return np.float64(((a % _P1) << _SHIFT) | (b % _P2))


@numba.njit(nogil=True, cache=True)
def hash_rows(words, keys, out):
    """``words`` [N, W] uint32 -> ``out`` float64 [N]: ``row_hash`` of each row, for rows the
    fused kernel does not take (integer ids, rows too long for torch's order, no agreement)."""
    for r in range(words.shape[0]):
        a, b = nh_sums(words[r], keys)
        out[r] = fold(a, b)


def _rows_kernel(x, words, keys, out) -> int:
    """``x`` float32 [N, D] C-contiguous (``words``: the same bytes as uint32) -> ``out``
    float64 [5, N]: min, max, sum, l2 and the row hash (``row_hash``, with its ``keys``) of
    each row; returns the flags ``ZERO_MIN_MAX | NONFINITE_SUM`` that hold for some row."""
    n, d = x.shape
    mn, mx, total, l2, hashes = out[0], out[1], out[2], out[3], out[4]
    vec = d // _LANES
    ceil_log2, rest = 1, vec // _ILP - 1  # torch: level power = max(4, CeilLog2(size) / num_levels)
    while rest > 1:
        rest >>= 1
        ceil_log2 += 1
    bits = max(_MIN_BITS, ceil_log2 // _LEVELS)
    flags = 0
    for r in range(n):
        total[r] = _row_sum(x[r], bits)
        _norm_min_max(x, r, l2, mn, mx, vec)
        a, b = nh_sums(words[r], keys)  # the row is in L1 now: the hash costs no read
        hashes[r] = fold(a, b)
        if mn[r] == 0.0 or mx[r] == 0.0:
            flags |= ZERO_MIN_MAX
        if not np.isfinite(total[r]):
            flags |= NONFINITE_SUM
    return flags


@functools.cache
def _compiled() -> Callable:
    """The kernel compiled with LLVM's SLP vectorizer on (see the module docstring); numba's
    on-disk cache makes this a load after the first process."""
    fn = numba.njit(nogil=True, cache=True, boundscheck=False)(_rows_kernel)
    sig = (numba.float32[:, ::1], numba.uint32[:, ::1], numba.uint32[:, ::1], numba.float64[:, ::1])
    with global_compiler_lock:
        before = numba_config.SLP_VECTORIZE
        numba_config.SLP_VECTORIZE = 1
        try:
            fn.compile(sig)
        finally:
            numba_config.SLP_VECTORIZE = before
    return fn


def row_sums(flt: torch.Tensor, keys: np.ndarray) -> tuple[torch.Tensor, int]:
    """(float64 [5, N]: min, max, sum, l2 and ``row_hash`` of each row of ``flt`` float32
    [N, D], C-contiguous on the CPU, every entry finite or not; flags). ``keys``: the hash's,
    ``row_hash.keys(D)``. ``flags & ZERO_MIN_MAX`` when some min or max is zero (whose sign
    depends on the order), ``flags & NONFINITE_SUM`` when some row holds NaN/inf. min and max
    are float32 values, exact in float64.

    Why one output block and flags: the call costs ~10 us per site and forward besides the
    pass itself, and a tensor per output plus a numpy check per answer cost as much again.
    One thread: splitting the rows over two threads (the kernel releases the GIL) was
    measured slower here, the handoff costing more than half a site's pass (and for the
    logits no faster in place, docs/measurements/tracker-overhead.md).
    """
    out = torch.empty(5, len(flt), dtype=torch.float64)
    x = flt.numpy()
    flags = _compiled()(x, x.view(np.uint32), keys, out.numpy())
    return out, flags
