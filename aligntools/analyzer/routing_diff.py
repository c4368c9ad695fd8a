"""MoE routing diff: which tokens picked other experts, and were they near-ties?

Why margins: a flip between two experts whose router scores differ by less than the
numerical error of the scores is noise that any precision change will cause (fix: a
stable, deterministic top-k or higher router precision); a flip at a large margin means the
router *input* really differs (an upstream bug). The margin of a token is the gap between
its k-th and (k+1)-th softmax router score on side a.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from aligntools import sites as S
from aligntools.analyzer.token_align import Alignment

TIE_EPS = 1e-3
"""Margin below which a flip counts as a near-tie when side b has no router scores to
measure the score error with."""


def topk_rows(ids_a: np.ndarray, ids_b: np.ndarray) -> dict[str, np.ndarray]:
    """Per token: ``set_flip`` = top-k *sets* differ; ``order_flip`` = same set, other order."""
    same_set = (np.sort(ids_a, axis=1) == np.sort(ids_b, axis=1)).all(axis=1)
    same_order = (ids_a == ids_b).all(axis=1)
    return {"set_flip": (~same_set).astype(np.float64),
            "order_flip": (same_set & ~same_order).astype(np.float64)}


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _take(ds: xr.Dataset, site: str, idx: np.ndarray | None) -> np.ndarray | None:
    if site not in ds or "stat" in ds[site].dims:
        return None
    v = ds[site].values
    return v if idx is None else v[idx]


def routing_diff(a: xr.Dataset, b: xr.Dataset, alignment: Alignment) -> pd.DataFrame:
    """One row per MoE layer with ``topk_ids`` on both sides.

    Columns: ``set_flip`` (fraction of tokens whose top-k set differs), ``order_flip`` (same
    set, other order), ``margin_all``/``margin_flipped`` (median k-th vs (k+1)-th score gap
    over all / set-flipped tokens), ``near_tie`` (fraction of set flips whose margin is within
    the token's router-score error - twice the max |softmax a - softmax b| - or TIE_EPS).
    """
    rows = []
    layers = sorted({S.parse(s).layer for s in a.data_vars if S.parse(s).kind == "topk_ids"} - {None})
    for i in layers:
        ids_a = _take(a, f"L{i}.topk_ids", alignment.idx_a)
        ids_b = _take(b, f"L{i}.topk_ids", alignment.idx_b)
        if ids_a is None or ids_b is None or ids_a.shape != ids_b.shape:
            continue
        flips = topk_rows(ids_a, ids_b)
        flipped = flips["set_flip"] > 0
        logits_a = _take(a, f"L{i}.router_logits", alignment.idx_a)
        logits_b = _take(b, f"L{i}.router_logits", alignment.idx_b)
        margin = np.full(len(ids_a), np.nan)
        tie_tol = np.full(len(ids_a), TIE_EPS)
        k = ids_a.shape[1]
        if logits_a is not None and logits_a.shape[1] > k:
            pa = _softmax(logits_a.astype(np.float64))
            top = -np.sort(-pa, axis=1)
            margin = top[:, k - 1] - top[:, k]
            if logits_b is not None and logits_b.shape == logits_a.shape:
                tie_tol = 2 * np.abs(_softmax(logits_b.astype(np.float64)) - pa).max(axis=1)
        near = flipped & (margin <= tie_tol)
        n_flip = int(flipped.sum())
        rows.append({
            "layer": i, "n_tokens": len(ids_a), "k": k,
            "set_flip": float(flipped.mean()) if len(ids_a) else 0.0,
            "order_flip": float(flips["order_flip"].mean()) if len(ids_a) else 0.0,
            "margin_all": float(np.nanmedian(margin)) if np.isfinite(margin).any() else np.nan,
            "margin_flipped": float(np.nanmedian(margin[flipped])) if np.isfinite(margin[flipped]).any() else np.nan,
            "near_tie": float(near.sum() / n_flip) if n_flip and np.isfinite(margin).any() else np.nan,
        })
    cols = ["layer", "n_tokens", "k", "set_flip", "order_flip", "margin_all", "margin_flipped", "near_tie"]
    return pd.DataFrame(rows, columns=cols).set_index("layer")
