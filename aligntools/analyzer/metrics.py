"""Per-token error metrics between two captured tensors, vectorised and chunked.

Why a two-stage design (row *sums* first, metrics derived after): every metric we report
(max/mean abs, relative L2, cosine, SQNR, permille error ratio, bf16-ULP distance) is a
function of a handful of per-row reductions. Computing those reductions once, in float64,
over cache-sized chunks with preallocated buffers is what makes ``compare`` run at
~1 GB/s of captured data on one core; per-token and per-site metrics are then cheap
functions of the sums (``derive``), and site totals are sums of row sums (``aggregate``).

Conventions: ``a`` is the trusted side (baseline / training engine), ``b`` the side under
test; relative metrics divide by ``a``. Elements where either side is NaN/Inf are left out
of the sums and counted separately, so one NaN is a finding, not a poisoned table.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from aligntools.tracker.stats import STAT_NAMES

PERMILLE = 1e-3
"""An element counts as a permille error when ``|b - a| > PERMILLE * |a|`` (msProbe's
"one-thousandth error ratio", reported here as the fraction that *fails* it)."""

CHUNK_ELEMS = 1 << 16
"""Elements per chunk: the ~3 MiB workspace stays in cache (L2 + L3 on the 2-core CI box)."""

DOT_BLOCK = 8192
"""Longest vector handed to one dot product. numpy's dot calls OpenBLAS, which spreads
vectors longer than ~10k elements over threads; on a shared 2-core box that hand-off made
32k-wide rows ~40x slower (measured 0.03 vs 1.1 GB/s), so long rows are dotted in blocks
and the block results summed."""

_BF16_ULP = float(1 << 16)  # fp32 ordinals per bf16 ULP (bf16 = top 16 bits of fp32)

ROW_SUMS = ("sum_d2", "sum_a2", "sum_b2", "sum_ab", "sum_absd", "max_absd", "n_rel",
            "max_ulp", "n_valid", "nonfinite_a", "nonfinite_b", "nonfinite_mismatch",
            "missing_a", "missing_b")


def _ordinal(x32: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> np.ndarray:
    """fp32 values -> monotone integers (as float64): sign-magnitude bits made two's-complement.

    Adjacent fp32 values differ by 1, so ``|ord(a) - ord(b)| / 2**16`` is the distance in
    bf16 ULPs (exact for bf16-representable values, fractional otherwise). ``tmp`` is an
    int32 buffer of x's shape.
    """
    i = x32.view(np.int32)
    np.right_shift(i, 31, out=tmp)
    np.bitwise_and(tmp, 0x7FFFFFFF, out=tmp)
    np.bitwise_xor(i, tmp, out=tmp)
    np.copyto(out, tmp)
    return out


class _Workspace:
    """Preallocated float64 buffers for one worker: fresh 512 KiB temporaries per numpy op
    go through mmap/munmap and page faults, which costs more than the arithmetic."""

    def __init__(self, n: int) -> None:
        self.bufs = [np.empty(n) for _ in range(4)] + [np.empty(n, np.int32)]  # A B D T I32
        self.bufs += [np.empty(n, np.float32) for _ in range(2)] + [np.empty(n, bool)]

    def views(self, rows: int, width: int) -> tuple[np.ndarray, ...]:
        n = rows * width
        return tuple(buf[:n].reshape(rows, width) for buf in self.bufs)


def _chunk_sums(a: np.ndarray, b: np.ndarray, ws: _Workspace, out: dict[str, np.ndarray],
                sl: slice) -> None:
    """Fill ``out[*][sl]`` for rows ``a``/``b`` (each [r, D], any float dtype)."""
    rows, width = a.shape
    A, B, *bufs = ws.views(rows, width)
    np.copyto(A, a)
    np.copyto(B, b)
    out["n_valid"][sl] = width
    _reduce(A, B, bufs, out, sl)
    # NaN/Inf poison the sums: only then pay for locating them (the rare path)
    if not (np.isfinite(out["sum_a2"][sl]).all() and np.isfinite(out["sum_b2"][sl]).all()):
        _mask_nonfinite(A, B, out, sl)
        _reduce(A, B, bufs, out, sl)


@lru_cache(maxsize=64)
def _dot_block(width: int) -> int:
    """Largest divisor of ``width`` that is <= DOT_BLOCK (rows are split into such blocks)."""
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


def _reduce(A: np.ndarray, B: np.ndarray, bufs: list[np.ndarray], out: dict[str, np.ndarray],
            sl: slice) -> None:
    D, T, I32, A32, B32, M = bufs
    np.subtract(B, A, out=D)
    out["sum_d2"][sl] = _rowdot(D, D)
    out["sum_a2"][sl] = _rowdot(A, A)
    out["sum_b2"][sl] = _rowdot(B, B)
    out["sum_ab"][sl] = _rowdot(A, B)
    np.abs(D, out=D)
    out["sum_absd"][sl] = D.sum(axis=1)
    out["max_absd"][sl] = D.max(axis=1, initial=0.0)
    np.abs(A, out=T)
    T *= PERMILLE
    out["n_rel"][sl] = np.count_nonzero(np.greater(D, T, out=M), axis=1)
    np.copyto(A32, A, casting="same_kind")  # exact for fp32 input; rounds float64 input
    np.copyto(B32, B, casting="same_kind")
    np.subtract(_ordinal(A32, I32, T), _ordinal(B32, I32, D), out=T)
    np.abs(T, out=T)
    out["max_ulp"][sl] = T.max(axis=1, initial=0.0) / _BF16_ULP


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


def _rows(x: np.ndarray, idx: np.ndarray | None, start: int, stop: int) -> np.ndarray:
    return x[start:stop] if idx is None else x[idx[start:stop]]


def row_sums(a: np.ndarray, b: np.ndarray, idx_a: np.ndarray | None = None,
             idx_b: np.ndarray | None = None, workers: int | None = None) -> dict[str, np.ndarray]:
    """Per-row reductions of ``b - a`` over everything after the token dim.

    a, b: [N_a, ...], [N_b, ...] with equal trailing shape; ``idx_a``/``idx_b`` ([N]) pick
    and order the aligned rows (None = all rows in order). Returns ``ROW_SUMS`` arrays [N].
    Rows are processed in chunks of ~``CHUNK_ELEMS`` elements by ``workers`` threads (numpy
    releases the GIL). Default 1: on the shared 2-core box a second thread measured anywhere
    from 7% slower to 27% faster depending on other jobs' load - it pays only on idle cores.
    """
    n = len(a) if idx_a is None else len(idx_a)
    a2 = a.reshape(len(a), -1)
    b2 = b.reshape(len(b), -1)
    width = max(a2.shape[1], 1)
    out = {k: np.zeros(n) for k in ROW_SUMS}
    step = max(1, CHUNK_ELEMS // width)
    starts = range(0, n, step)
    workers = max(1, min(workers or 1, len(os.sched_getaffinity(0))))
    blocks = [starts[i::workers] for i in range(workers)]

    def run(block: range) -> None:
        ws = _Workspace(step * width)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: found and masked after
            for s in block:
                e = min(s + step, n)
                _chunk_sums(_rows(a2, idx_a, s, e), _rows(b2, idx_b, s, e), ws, out, slice(s, e))

    if workers == 1 or len(starts) < 4:
        run(starts)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, blocks))
    return out


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


# ---------------------------------------------------------------- logits

LOGIT_CHUNK_ELEMS = 1 << 16  # rows x vocab per chunk: float64 buffers stay in cache


def _log_partition(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [r, V] float64 -> (log Z [r], exp(x - max) [r, V], sum of it [r]): log p = x - log Z."""
    m = x.max(axis=1)
    m[~np.isfinite(m)] = 0.0
    ez = np.exp(x - m[:, None])
    s = ez.sum(axis=1)
    return m + np.log(s), ez, s


def logit_rows(a: np.ndarray, b: np.ndarray, next_ids: np.ndarray, idx_a: np.ndarray | None = None,
               idx_b: np.ndarray | None = None, valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Distribution metrics per token from logits a, b [N, V] (float64 log-softmax).

    kl = KL(softmax a || softmax b); dlogprob = |log p_b(t) - log p_a(t)| for the given next
    token t (``next_ids`` [N], -1 where unknown -> NaN); top1 = argmax agreement (0/1).
    Rows outside ``valid`` ([N] bool, e.g. not captured on one side) are NaN.
    KL uses sum(p_a) = 1: KL = log Z_b - log Z_a - sum p_a (x_b - x_a), one exp per side.
    """
    n = len(a) if idx_a is None else len(idx_a)
    vocab = a.shape[1]
    kl, dlp, top1 = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    step = max(1, LOGIT_CHUNK_ELEMS // vocab)
    for s in range(0, n, step):
        e = min(s + step, n)
        if valid is not None and not valid[s:e].any():
            continue
        xa = _rows(a, idx_a, s, e).astype(np.float64)
        xb = _rows(b, idx_b, s, e).astype(np.float64)
        lza, eza, sa = _log_partition(xa)
        lzb, _, _ = _log_partition(xb)
        with np.errstate(invalid="ignore"):
            d = xb - xa
            kl[s:e] = lzb - lza - _rowdot(eza, d) / sa
            bad = ~np.isfinite(kl[s:e])  # -inf logits (masked vocab): the elementwise form
            if bad.any():
                pa = eza[bad] / sa[bad, None]
                delta = (xa[bad] - lza[bad, None]) - (xb[bad] - lzb[bad, None])
                kl[s:e][bad] = np.where(pa > 0, pa * delta, 0.0).sum(axis=1)
        t = next_ids[s:e]
        r = np.flatnonzero(t >= 0)
        dlp[s + r] = np.abs((xb[r, t[r]] - lzb[r]) - (xa[r, t[r]] - lza[r]))
        top1[s:e] = np.argmax(xa, axis=1) == np.argmax(xb, axis=1)
    if valid is not None:
        for v in (kl, dlp, top1):
            v[~valid] = np.nan
    return {"kl": kl, "dlogprob": dlp, "top1": top1}


def logit_summary(rows: dict[str, np.ndarray]) -> dict[str, float]:
    """Site-level logits metrics: KL max/mean, |dlogprob| max/mean/p99, top-1 agreement."""
    dlp = rows["dlogprob"][np.isfinite(rows["dlogprob"])]
    kl = rows["kl"][np.isfinite(rows["kl"])]
    nan = float("nan")
    return {
        "kl_max": float(kl.max()) if kl.size else nan,
        "kl_mean": float(kl.mean()) if kl.size else nan,
        "dlogprob_max": float(dlp.max()) if dlp.size else nan,
        "dlogprob_mean": float(dlp.mean()) if dlp.size else nan,
        "dlogprob_p99": float(np.percentile(dlp, 99)) if dlp.size else nan,
        "top1_agree": float(np.nanmean(rows["top1"])) if np.isfinite(rows["top1"]).any() else nan,
    }


# ---------------------------------------------------------------- stats mode

def stats_rows(sa: np.ndarray, sb: np.ndarray) -> dict[str, np.ndarray]:
    """Lower bounds of the tensor metrics from per-token stats [N, len(STAT_NAMES)] of both sides.

    By the triangle inequality | ||a|| - ||b|| | <= ||b - a||, |max a - max b| <= max|b - a|
    and |mean a - mean b| <= mean|b - a|: a stats comparison can miss an error but never
    invents one. ``exact`` is 1 where both content hashes are present and equal.
    """
    col = {k: i for i, k in enumerate(STAT_NAMES)}
    g = lambda s, k: s[:, col[k]]  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        dl2 = np.abs(g(sb, "l2") - g(sa, "l2"))
        rel = np.where(dl2 == 0, 0.0, dl2 / g(sa, "l2"))
    exact = (g(sa, "hash") == g(sb, "hash")).astype(np.float64)
    nonfinite_a = g(sa, "n_nan") + g(sa, "n_inf")
    nonfinite_b = g(sb, "n_nan") + g(sb, "n_inf")
    return {
        "max_abs": np.maximum(np.abs(g(sb, "max") - g(sa, "max")), np.abs(g(sb, "min") - g(sa, "min"))),
        "mean_abs": np.abs(g(sb, "mean") - g(sa, "mean")),
        "rel_l2": rel,
        "l2_a": g(sa, "l2"),
        "dl2": dl2,
        "exact": exact,
        "nonfinite_a": nonfinite_a,
        "nonfinite_b": nonfinite_b,
        "nonfinite_mismatch": np.abs(nonfinite_a - nonfinite_b),
    }


def stats_summary(rows: dict[str, np.ndarray]) -> dict[str, float]:
    """Site-level lower bounds from ``stats_rows`` (drops its helper columns ``l2_a``, ``dl2``).
    Rows whose stats are NaN (not emitted on a side) are left out."""
    l2a = rows.pop("l2_a")
    dl2 = rows.pop("dl2")  # per-token | ||b|| - ||a|| |, a lower bound of ||b - a|| (also when ||a|| = 0)
    ok = np.isfinite(dl2)
    return {
        "max_abs": float(np.nanmax(rows["max_abs"], initial=0.0)),
        "mean_abs": float(np.nanmean(rows["mean_abs"])) if ok.any() else np.nan,
        "rel_l2": float(np.sqrt(np.sum(dl2[ok] ** 2) / np.sum(l2a[ok] ** 2))) if dl2[ok].any() else 0.0,
        "exact": float(rows["exact"].mean()),
        "n_tokens": int(ok.sum()),
        **{k: float(np.nansum(rows[k])) for k in ("nonfinite_a", "nonfinite_b", "nonfinite_mismatch")},
    }


# ---------------------------------------------------------------- top-k ids

def topk_rows(ids_a: np.ndarray, ids_b: np.ndarray) -> dict[str, np.ndarray]:
    """Per token: ``set_flip`` = top-k *sets* differ; ``order_flip`` = same set, other order."""
    same_set = (np.sort(ids_a, axis=1) == np.sort(ids_b, axis=1)).all(axis=1)
    same_order = (ids_a == ids_b).all(axis=1)
    return {"set_flip": (~same_set).astype(np.float64),
            "order_flip": (same_set & ~same_order).astype(np.float64)}
