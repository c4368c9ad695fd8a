"""Per-token error metrics between two captured tensors, in one cache-resident pass per chunk.

Why a two-stage design (row *sums* first, metrics derived after): every metric we report
(max/mean abs, relative L2, cosine, SQNR, permille error ratio, bf16-ULP distance) is a
function of a handful of per-row reductions. ``chunk_metrics`` computes all of them - and,
for logits, KL, Δlogprob and top-1 from the same float64 rows - in one visit of each chunk
of rows, with the chunk's float64 scratch in cache (``aligntools.analyzer.tiled_scan`` cuts the
rows into chunks and runs them on threads); per-token and per-site metrics are then cheap
functions of the sums (``derive``), and site totals are sums of row sums (``aggregate``).

Why the reductions are the ones they are: per-token values must not move with chunking or
threads (a rewrite that moves a relative error in its last bit can flip a verdict on its
limit; ``tests/aligntools/analyzer/test_pinned_metrics.py`` pins them), so every row is
reduced by the same call on the same float64 row whatever chunk it sits in: BLAS dot
products, numpy's pairwise row sums, exact maxima and counts.

Conventions: ``a`` is the trusted side (baseline / training engine), ``b`` the side under
test; relative metrics divide by ``a``. Elements where either side is NaN/Inf are left out
of the sums and counted separately, so one NaN is a finding, not a poisoned table.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import replace
from functools import cache, lru_cache, partial

import numpy as np

from aligntools.analyzer import compiled_metrics, tiled_scan
from aligntools.analyzer import logit_metrics as L
from aligntools.analyzer.logit_metrics import LOGIT_ROWS
from aligntools.analyzer.tiled_scan import Job, Rows

PERMILLE = 1e-3
"""An element counts as a permille error when ``|b - a| > PERMILLE * |a|`` (msProbe's
"one-thousandth error ratio", reported here as the fraction that *fails* it)."""

CHUNK_ELEMS = 1 << 16
"""Elements per chunk: the ~2.9 MiB workspace (45 B per element) stays in L2 + L3 on the
2-core CI box; smaller chunks pay more for the ~30 numpy calls per chunk than they save
(measured 1.7 GB/s at 2**15, 2.0 at 2**16, no better above). Keep it: rows whose dot
product falls back to ``np.einsum`` (widths without a divisor in [256, DOT_BLOCK]) round
differently when alone in a chunk, so the chunk size is part of the pinned numbers."""

DOT_BLOCK = 8192
"""Longest vector handed to one dot product. numpy's dot calls OpenBLAS, which spreads
vectors longer than ~10k elements over threads; on a shared 2-core box that hand-off made
32k-wide rows ~40x slower (measured 0.03 vs 1.1 GB/s), so long rows are dotted in blocks
and the block results summed."""

_BF16_ULP = float(1 << 16)  # fp32 ordinals per bf16 ULP (bf16 = top 16 bits of fp32)

ROW_SUMS = ("sum_d2", "sum_a2", "sum_b2", "sum_ab", "sum_absd", "max_absd", "n_rel",
            "max_ulp", "n_valid", "nonfinite_a", "nonfinite_b", "nonfinite_mismatch",
            "missing_a", "missing_b")


class Workspace:
    """One thread's scratch for a chunk of rows, grown on demand and reused: fresh
    temporaries per numpy op go through mmap/munmap and page faults, which cost more than
    the arithmetic, and reused buffers stay in cache. The views of the last chunk shape are
    kept: the chunks of a tile share one."""

    def __init__(self, order: int | None = None) -> None:
        self.compiled = None if order is None else compiled_metrics.Scratch(order)
        """Scratch of the compiled path in ``ddot`` order ``order`` (``ddot_order``), None
        where the numpy path runs (``run_jobs``)."""
        self._f64 = np.empty(0)
        self._i32 = np.empty(0, np.int32)
        self._mask = np.empty(0, bool)
        self._views: tuple[tuple[int, int], tuple[np.ndarray, ...]] = ((0, 0), ())

    def views(self, rows: int, width: int) -> tuple[np.ndarray, ...]:
        """A, B, D, T float64, U1, U2, U3 int32 and M bool, each [rows, width]."""
        if self._views[0] != (rows, width):
            n = rows * width
            if self._mask.size < n:
                self._f64, self._i32, self._mask = np.empty(4 * n), np.empty(3 * n, np.int32), np.empty(n, bool)
            f64 = [self._f64[i * n:(i + 1) * n].reshape(rows, width) for i in range(4)]
            i32 = [self._i32[i * n:(i + 1) * n].reshape(rows, width) for i in range(3)]
            self._views = ((rows, width), (*f64, *i32, self._mask[:n].reshape(rows, width)))
        return self._views[1]


def chunk_metrics(xa: np.ndarray, xb: np.ndarray, ws: Workspace, sl: slice, out: dict[str, np.ndarray],
                  next_ids: np.ndarray | None = None) -> None:
    """Fill ``out[*][sl]`` (``ROW_SUMS``, plus ``LOGIT_ROWS`` given ``next_ids`` [N]) for chunk
    rows ``xa``/``xb`` [r, D] (any float dtype) in one visit: the rows are widened to float64
    once, into cache-resident scratch that every metric reuses.

    NaN/Inf poison the sums of squares; only then (the rare path) are they located, left
    out and the sums and ULP distance redone on what is left (``_mask_nonfinite``).

    With ``ws.compiled`` the compiled kernels do it where they apply (``_compiled_chunk``);
    where not, the numpy path takes the rows in its own chunk size, so its float64 scratch
    stays as small as ever (captures read from disk count it against ``max_memory``).
    """
    if ws.compiled is None:
        _numpy_chunk(xa, xb, ws, sl, out, next_ids)
    elif not _compiled_chunk(xa, xb, ws, sl, out, next_ids):
        step = max(1, CHUNK_ELEMS // max(xa.shape[1], 1))
        for s in range(0, len(xa), step):
            rows = slice(s, min(s + step, len(xa)))
            _numpy_chunk(xa[rows], xb[rows], ws, slice(sl.start + rows.start, sl.start + rows.stop), out, next_ids)


def _numpy_chunk(xa: np.ndarray, xb: np.ndarray, ws: Workspace, sl: slice, out: dict[str, np.ndarray],
                 next_ids: np.ndarray | None) -> None:
    """``chunk_metrics`` by numpy calls on the chunk's float64 copy: the definition of the numbers."""
    A, B, D, T, U1, U2, U3, M = ws.views(*xa.shape)
    out["max_ulp"][sl] = _max_ulp(xa, xb, U1, U2, U3)  # while the captured rows are in cache
    np.copyto(A, xa)
    np.copyto(B, xb)
    np.subtract(B, A, out=D)
    if next_ids is not None:  # before NaN masking: the distributions are those captured
        L.logit_chunk(A, B, T, partial(_rowdot, y=D), next_ids[sl], out, sl)
    out["n_valid"][sl] = xa.shape[1]
    out["sum_a2"][sl] = a2 = _rowdot(A, A)
    out["sum_b2"][sl] = b2 = _rowdot(B, B)
    if not math.isfinite(a2.sum() + b2.sum()):  # sums of squares: finite iff every row's is
        _mask_nonfinite(A, B, out, sl)
        np.subtract(B, A, out=D)
        out["sum_a2"][sl] = _rowdot(A, A)
        out["sum_b2"][sl] = _rowdot(B, B)
        out["max_ulp"][sl] = _max_ulp(A, B, U1, U2, U3)
    out["sum_d2"][sl] = _rowdot(D, D)
    out["sum_ab"][sl] = _rowdot(A, B)
    np.abs(D, out=D)
    out["sum_absd"][sl] = D.sum(axis=1)
    out["max_absd"][sl] = D.max(axis=1, initial=0.0)
    np.abs(A, out=T)
    T *= PERMILLE
    out["n_rel"][sl] = _row_count(np.greater(D, T, out=M))


def _compiled_chunk(xa: np.ndarray, xb: np.ndarray, ws: Workspace, sl: slice, out: dict[str, np.ndarray],
                    next_ids: np.ndarray | None) -> bool:
    """``chunk_metrics`` by the compiled kernels, which round exactly like the numpy path;
    False (nothing kept) where they do not apply: not float32, an ``einsum`` width, NaN/Inf."""
    k = _dot_block(xa.shape[1])
    if not compiled_metrics.covers(xa, xb, k):
        return False
    sums = compiled_metrics.row_sums(xa, xb, k, PERMILLE, ws.compiled)
    if sums is None:
        return False
    for key, row in zip(ROW_SUMS[:compiled_metrics.N_SUMS], sums, strict=True):
        out[key][sl] = row
    out["n_valid"][sl] = xa.shape[1]
    if next_ids is not None:
        dot_diff = partial(compiled_metrics.logit_dots, xa=xa, xb=xb, dot_block=k, scratch=ws.compiled)
        L.logit_chunk(xa, xb, ws.compiled.ez(*xa.shape), dot_diff, next_ids[sl], out, sl)
    return True


def _row_count(mask: np.ndarray) -> np.ndarray:
    """True values per row of a C-contiguous bool array [r, D]. Bools are 0/1 bytes, so
    the popcount of an 8-byte word is the number of trues in it: 3x faster than summing
    bools, where rows are whole words."""
    if mask.shape[1] % 8:
        return np.add.reduce(mask, axis=1, dtype=np.intp)
    return np.bitwise_count(mask.view(np.uint64)).sum(axis=1, dtype=np.intp)


def _max_ulp(xa: np.ndarray, xb: np.ndarray, U1: np.ndarray, U2: np.ndarray, U3: np.ndarray) -> np.ndarray:
    """Row max of the bf16-ULP distance of the fp32 values of rows xa, xb [r, D]: the rows
    themselves when fp32, else rounded to fp32 (exact for fp16, rounds float64) in ``U1``.
    U1..U3: int32 scratch of the rows' shape."""
    ua = _ulp_ordinal(_fp32(xa, U1), U2)
    ub = _ulp_ordinal(_fp32(xb, U1), U3)
    return _max_distance(ua, ub, U1.view(np.uint32)) / _BF16_ULP


def _fp32(x: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``x`` itself when fp32 (no copy), else ``x`` rounded to fp32 in int32 scratch ``buf``."""
    if x.dtype == np.float32:
        return x
    out = buf.view(np.float32)
    np.copyto(out, x, casting="same_kind")
    return out


def _ulp_ordinal(x32: np.ndarray, out: np.ndarray) -> np.ndarray:
    """fp32 values -> monotone uint32 ordinals: ``bits ^ 0x80000000`` for x >= +0,
    ``~bits`` for x <= -0. Adjacent fp32 values differ by 1 (-0 and +0 too), so the distance
    of two ordinals / 2**16 is the distance in bf16 ULPs (exact for bf16 values, fractional
    otherwise). ``out``: int32 buffer of x's shape."""
    bits = x32.view(np.int32)
    np.right_shift(bits, 31, out=out)  # -1 where negative, else 0
    np.bitwise_or(out, np.int32(-(1 << 31)), out=out)  # 0xFFFFFFFF or 0x80000000
    np.bitwise_xor(out, bits, out=out)
    return out.view(np.uint32)


def _max_distance(ua: np.ndarray, ub: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Row max of |ua - ub| of uint32 ordinals [r, D], exactly: max - min never wraps.
    Overwrites ``ub``; ``hi`` is uint32 scratch of the same shape."""
    np.maximum(ua, ub, out=hi)
    np.minimum(ua, ub, out=ub)
    np.subtract(hi, ub, out=ub)
    return ub.max(axis=1, initial=0)


@lru_cache(maxsize=64)
def _dot_block(width: int) -> int:
    """Largest divisor of ``width`` that is <= DOT_BLOCK (rows are split into such blocks);
    an empty row (width 0) is its own one block: its dot products are 0, nothing is valid."""
    if width <= 0:
        return width
    return next(d for d in range(min(width, DOT_BLOCK), 0, -1) if width % d == 0)


def _rowdot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-row dot products of [r, D] arrays, never one BLAS call on a long vector."""
    rows, width = x.shape
    k = _dot_block(width)
    if k == width:
        return np.vecdot(x, y)
    if k < 256:  # awkward width (e.g. a large prime): skip BLAS altogether
        return np.einsum("ij,ij->i", x, y)
    return np.vecdot(x.reshape(rows, -1, k), y.reshape(rows, -1, k)).sum(axis=1)


def _mask_nonfinite(A: np.ndarray, B: np.ndarray, out: dict[str, np.ndarray], sl: slice) -> None:
    """Count NaN/Inf per row and zero them on both sides.

    A row that is NaN in *every* element on one side is "not captured" there (the Tracker
    fills rows a site did not emit with NaN, e.g. prompt logits under ``generate``): it is
    counted in ``missing_a``/``missing_b`` and left out, not reported as a NaN finding.
    """
    na, nb = np.isnan(A), np.isnan(B)
    miss_a, miss_b = na.all(axis=1), nb.all(axis=1)
    fa, fb = np.isfinite(A), np.isfinite(B)
    same = (A == B) | (na & nb)  # inf == inf, nan "==" nan: consistent
    drop = (miss_a | miss_b)[:, None]
    out["missing_a"][sl] = miss_a & ~miss_b
    out["missing_b"][sl] = miss_b & ~miss_a
    out["nonfinite_a"][sl] = (~fa & ~drop).sum(axis=1)
    out["nonfinite_b"][sl] = (~fb & ~drop).sum(axis=1)
    out["nonfinite_mismatch"][sl] = ((~fa | ~fb) & ~same & ~drop).sum(axis=1)
    ok = fa & fb & ~drop
    out["n_valid"][sl] = ok.sum(axis=1)
    A[~ok] = 0.0
    B[~ok] = 0.0


def site_job(a: Rows, b: Rows, next_ids: np.ndarray | None = None) -> tuple[Job, dict[str, np.ndarray]]:
    """The tiled_scan job computing every per-row metric of one site, and the [N] arrays it fills
    (``ROW_SUMS``, and ``LOGIT_ROWS`` when ``next_ids`` [N] is given: a logits site)."""
    n = len(a)
    out = {k: np.zeros(n) for k in ROW_SUMS}
    if next_ids is not None:
        out |= {k: np.full(n, np.nan) for k in LOGIT_ROWS}
    return Job(a, b, partial(chunk_metrics, out=out, next_ids=next_ids)), out


def run_jobs(jobs: list[Job], workers: int | None = None, max_memory: int | None = None,
             progress: bool | None = None) -> None:
    """Run ``site_job``s in one tiled_scan (``aligntools.analyzer.tiled_scan.run``), on the compiled
    kernels where they apply, in the ``ddot`` order that agrees with numpy on this machine
    (``compiled_metrics``, ``ddot_order``)."""
    order = ddot_order() if compiled_metrics.wanted(sum(j.nbytes for j in jobs)) else None
    if order is not None:
        jobs = [replace(j, chunk_elems=compiled_metrics.CHUNK_ELEMS) if _compiled_site(j) else j for j in jobs]
    tiled_scan.run(jobs, partial(Workspace, order), CHUNK_ELEMS, workers, max_memory, progress)


def _compiled_site(job: Job) -> bool:
    """Whether the compiled kernels take a site's rows (``compiled_metrics.takes``)."""
    width = job.a.width
    return compiled_metrics.takes(job.a.data.dtype, job.b.data.dtype, width, _dot_block(max(width, 1)))


PROBE_WIDTHS = (24, 1000, 2048, 4096 + 16 + 7, 24576)
"""Row widths the compiled kernels are checked on: a BLAS tail only, both BLAS loops with
tails, whole 32-lane blocks, an odd multiple, and a row dotted in 8192-blocks."""


@cache
def ddot_order() -> int | None:
    """The ``numba_reductions.DDOT_ORDERS`` value whose compiled kernels give exactly numpy's
    bits on this machine, checked once per process on random probe rows of ``PROBE_WIDTHS``
    (logits metrics included): their dot products copy one OpenBLAS kernel's order, and the
    CPU decides which kernel numpy runs. The choice is logged once; None (with a warning)
    sends every comparison to the numpy path."""
    try:
        orders = compiled_metrics.kernels().DDOT_ORDERS
    except ImportError as e:
        warnings.warn(f"compare: compiled kernels unavailable ({e}); using the numpy path", stacklevel=2)
        return None
    probes = _probe_rows()
    for name, order in orders.items():
        if all(_same_bits(xa, xb, next_ids, order) for xa, xb, next_ids in probes):
            logging.getLogger(__name__).info("compare: compiled kernels in OpenBLAS's %s ddot order", name)
            return order
    warnings.warn(f"compare: the compiled kernels round differently from numpy on this machine in every ddot "
                  f"order they know ({', '.join(orders)}); using the numpy path", stacklevel=2)
    return None


def compiled_path_agrees() -> bool:
    """Whether some ``ddot`` order of the compiled kernels gives numpy's bits here."""
    return ddot_order() is not None


def _probe_rows() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(xa, xb [rows, width] float32, next_ids [rows]) per ``PROBE_WIDTHS``, from a fixed seed."""
    rng = np.random.default_rng(0)
    probes = []
    for width in PROBE_WIDTHS:
        rows = max(4, CHUNK_ELEMS // width)
        xa = (rng.standard_normal((rows, width)) * rng.exponential(4.0, (rows, 1))).astype(np.float32)
        xb = (xa * (1 + 1e-3 * rng.standard_normal(xa.shape))).astype(np.float32)
        xb[:, ::5] = xa[:, ::5]
        probes.append((xa, xb, rng.integers(-1, width, rows)))
    return probes


def _same_bits(xa: np.ndarray, xb: np.ndarray, next_ids: np.ndarray, order: int) -> bool:
    """Whether the kernels in ``order`` give every metric of these rows in numpy's bits."""
    rows = len(xa)
    got = []
    for ws in (Workspace(None), Workspace(order)):
        out = {k: np.zeros(rows) for k in ROW_SUMS} | {k: np.full(rows, np.nan) for k in LOGIT_ROWS}
        chunk_metrics(xa, xb, ws, slice(0, rows), out, next_ids)
        got.append(b"".join(out[k].tobytes() for k in (*ROW_SUMS, *LOGIT_ROWS)))
    return got[0] == got[1]


def row_metrics(a: np.ndarray, b: np.ndarray, idx_a: np.ndarray | None = None, idx_b: np.ndarray | None = None,
                next_ids: np.ndarray | None = None, workers: int | None = None) -> dict[str, np.ndarray]:
    """Per-row reductions of ``b - a`` over everything after the token dim (``ROW_SUMS``), and
    with ``next_ids`` the logits metrics (``LOGIT_ROWS``), in one pass.

    a, b: [N_a, ...], [N_b, ...] with equal trailing shape; ``idx_a``/``idx_b`` ([N]) pick
    and order the aligned rows (None = all rows in order). Returns arrays [N]. ``workers``
    threads (default: all cores) share the chunks; the values do not depend on it.
    """
    job, out = site_job(Rows.of(a, idx_a), Rows.of(b, idx_b), next_ids)
    run_jobs([job], workers)
    return out


def row_sums(a: np.ndarray, b: np.ndarray, idx_a: np.ndarray | None = None,
             idx_b: np.ndarray | None = None, workers: int | None = None) -> dict[str, np.ndarray]:
    """``ROW_SUMS`` arrays [N] of ``row_metrics``."""
    return row_metrics(a, b, idx_a, idx_b, workers=workers)


def derive(s: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Metrics from (row or total) sums. Works elementwise, so it serves tokens and sites.

    rel_l2 = ||b-a|| / ||a||; cosine(a, b); sqnr_db = 10 log10(||a||^2 / ||b-a||^2);
    permille_err = fraction of elements with relative error > 1e-3; ulp_max in bf16 ULPs.
    Degenerate cases are defined, not NaN: equal zero rows give rel_l2 0, cosine 1, SQNR inf.
    """
    d2, a2, b2, ab = s["sum_d2"], s["sum_a2"], s["sum_b2"], s["sum_ab"]
    n = np.maximum(s["n_valid"], 1)
    none = s["n_valid"] == 0  # nothing comparable (missing row): NaN, not a perfect score
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(d2 == 0, 0.0, np.sqrt(d2 / a2))
        cos = np.nan_to_num(np.where(d2 == 0, 1.0, ab / np.sqrt(a2 * b2)), nan=0.0)
        sqnr = np.where(d2 == 0, np.inf, 10 * np.log10(a2 / d2))
    metrics = {
        "max_abs": s["max_absd"],
        "mean_abs": s["sum_absd"] / n,
        "rel_l2": rel,
        "cosine": cos,
        "sqnr_db": sqnr,
        "permille_err": s["n_rel"] / n,
        "ulp_max": s["max_ulp"],
    }
    metrics = {k: np.where(none, np.nan, v) for k, v in metrics.items()}
    return metrics | {k: s[k] for k in ("nonfinite_a", "nonfinite_b", "nonfinite_mismatch",
                                        "missing_a", "missing_b")}


def aggregate(s: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Whole-site sums from row sums (maxima stay maxima), as 0-d arrays for ``derive``."""
    return {k: np.asarray(s[k].max(initial=0.0) if k.startswith("max") else s[k].sum()) for k in ROW_SUMS}

