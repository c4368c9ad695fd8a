"""Metrics of stats-mode captures: lower bounds of the tensor metrics from per-token stats.

Why its own module: a stats capture keeps 8 numbers per token per site instead of the
tensor (``aligntools.tracker.stats``), so its comparison is not a reduction of b - a like
``metrics`` but bounds from the triangle inequality, plus bit-equality from the content hash.
"""

from __future__ import annotations

import numpy as np

from aligntools.tracker.stats import STAT_NAMES


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
    miss_a, miss_b = not_captured(sa), not_captured(sb)
    drop = miss_a | miss_b  # as in tensor mode: a missing row is counted, not a NaN finding
    nonfinite_a = np.where(drop, 0.0, g(sa, "n_nan") + g(sa, "n_inf"))
    nonfinite_b = np.where(drop, 0.0, g(sb, "n_nan") + g(sb, "n_inf"))
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
        "missing_a": (miss_a & ~miss_b).astype(np.float64),
        "missing_b": (miss_b & ~miss_a).astype(np.float64),
    }


def not_captured(s: np.ndarray) -> np.ndarray:
    """[N] bool: rows of stats [N, len(STAT_NAMES)] that hold no value at all, i.e. the
    tensor row was all-NaN: the Tracker's fill for a row the site did not emit (every stat
    NaN, counts included), or the stats of an all-NaN tensor row (no finite entry, no inf).
    The same rows tensor mode counts as ``missing_a``/``missing_b``."""
    col = {k: i for i, k in enumerate(STAT_NAMES)}
    return np.isnan(s[:, col["l2"]]) & ~(s[:, col["n_inf"]] > 0)


def stats_summary(rows: dict[str, np.ndarray]) -> dict[str, float]:
    """Site-level lower bounds from ``stats_rows`` (drops its helper columns ``l2_a``, ``dl2``).
    Rows whose stats are NaN (not emitted on a side) are left out, and counted in
    ``missing_a``/``missing_b`` as in tensor mode. Those two are kept (in ``rows`` and the
    summary) only where some row is missing: elsewhere the stats result reads as it always did."""
    l2a = rows.pop("l2_a")
    dl2 = rows.pop("dl2")  # per-token | ||b|| - ||a|| |, a lower bound of ||b - a|| (also when ||a|| = 0)
    missing = {k: rows.pop(k) for k in ("missing_a", "missing_b")}
    if any(v.any() for v in missing.values()):
        rows.update(missing)
    ok = np.isfinite(dl2)
    return {
        "max_abs": float(np.nanmax(rows["max_abs"], initial=0.0)),
        "mean_abs": float(np.nanmean(rows["mean_abs"])) if ok.any() else np.nan,
        "rel_l2": float(np.sqrt(np.sum(dl2[ok] ** 2) / np.sum(l2a[ok] ** 2))) if dl2[ok].any() else 0.0,
        "exact": float(rows["exact"].mean()),
        "n_tokens": int(ok.sum()),
        **{k: float(np.nansum(rows[k])) for k in ("nonfinite_a", "nonfinite_b", "nonfinite_mismatch")},
        **{k: float(v.sum()) for k, v in missing.items() if k in rows},
    }
