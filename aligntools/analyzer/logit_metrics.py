"""Per-token metrics of logits: KL, |Δ logprob| of the next token, top-1 agreement.

Why its own module: the rest of ``metrics`` reduces any tensor the same way; logits add a
distribution on top - one log-softmax per row block, shared by KL, Δlogprob and top-1 - on
both of ``metrics``' paths (numpy's float64 rows, or the captured float32 rows beside the
compiled kernels, which give the same bits).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aligntools.analyzer import compiled_metrics

LOGIT_ROWS = ("kl", "dlogprob", "top1")


def logit_chunk(xa: np.ndarray, xb: np.ndarray, T: np.ndarray, dot_diff: Callable[[np.ndarray], np.ndarray],
                 next_ids: np.ndarray, out: dict[str, np.ndarray], sl: slice) -> None:
    """KL, Δlogprob and top-1 of logit rows xa, xb [r, V] as captured (float32 or their float64
    copies: every value below is computed in float64 from exact widenings, so both give the same
    bits). T: float64 scratch [r, V]; dot_diff(T) -> per-row T . (xb - xa) [r].

    kl = KL(softmax a || softmax b); dlogprob = |log p_b(t) - log p_a(t)| for the given next
    token t (``next_ids`` [r], -1 where unknown -> NaN); top1 = argmax agreement (0/1).
    The log-softmax is computed once per row block and shared: KL uses sum(p_a) = 1,
    KL = log Z_b - log Z_a - sum p_a (x_b - x_a), one exp per side; the argmax that gives
    top-1 also gives the max the exp is shifted by.
    """
    top_a, top_b = xa.argmax(axis=1), xb.argmax(axis=1)  # [r]
    lzb, _ = _log_partition(xb, top_b, T)
    lza, sa = _log_partition(xa, top_a, T)  # T = exp(A - max A) from here on
    kl = lzb - lza - dot_diff(T) / sa
    bad = ~np.isfinite(kl)  # -inf logits (masked vocab): the elementwise form
    if bad.any():
        pa = T[bad] / sa[bad, None]
        delta = (xa[bad] - lza[bad, None]) - (xb[bad] - lzb[bad, None])
        kl[bad] = np.where(pa > 0, pa * delta, 0.0).sum(axis=1)
    dlp = np.full(len(xa), np.nan)
    r = np.flatnonzero(next_ids >= 0)
    t = next_ids[r]
    dlp[r] = np.abs((xb[r, t] - lzb[r]) - (xa[r, t] - lza[r]))
    out["kl"][sl], out["dlogprob"][sl], out["top1"][sl] = kl, dlp, top_a == top_b


def _log_partition(x: np.ndarray, top: np.ndarray, ez: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [r, V] (float64, or float32 on the compiled path) and its row argmax -> (log Z [r],
    sum of exp(x - max) [r]), with exp(x - max) left in ``ez``: log p = x - log Z. x[argmax]
    is the row max (NaN where the row holds a NaN, like ``max``). The exp is always numpy's
    (its SIMD exp rounds differently from libm's); the compiled path only shifts and sums."""
    compiled = x.dtype == np.float32  # numpy's path hands its float64 copy
    if compiled:
        m = compiled_metrics.kernels().shift_rows(x, top, ez)
    else:
        m = x[np.arange(len(x)), top]
        m[~np.isfinite(m)] = 0.0
        np.subtract(x, m[:, None], out=ez)
    np.exp(ez, out=ez)
    s = np.empty(len(x))
    if compiled:
        compiled_metrics.kernels().row_pairwise(ez, s)
    else:
        np.add.reduce(ez, axis=1, out=s)
    return m + np.log(s), s


def mask_rows(out: dict[str, np.ndarray], valid: np.ndarray | None) -> dict[str, np.ndarray]:
    """The ``LOGIT_ROWS`` of a site's outputs, NaN outside ``valid`` [N] bool (None: all)."""
    rows = {k: out[k] for k in LOGIT_ROWS}
    if valid is not None:
        for v in rows.values():
            v[~valid] = np.nan
    return rows


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
