"""Synthetic captures in the contract format (docs/architecture.md), for Analyzer unit tests.

Why synthetic: the Analyzer's logic (metrics, alignment, divergence, diagnosis) is tested
on data whose errors we plant exactly; real-model tests live in test_planted_faults.py.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from aligntools import sites as S

DIMS = {"hidden": 16, "q_dim": 16, "kv_dim": 8, "expert": 8, "k": 2, "vocab": 32, "feature": 4}


def make_capture(n_layers: int = 3, requests: int = 2, seq: int = 8, moe_layers: tuple[int, ...] = (),
                 seed: int = 0, dtype: str = "float32") -> xr.Dataset:
    """Random values at every site of an ``n_layers`` model; routing consistent with logits."""
    rng = np.random.default_rng(seed)
    n = requests * seq
    data = {}
    for site in S.all_sites(n_layers, set(moe_layers)):
        kind = S.parse(site).kind
        dims = ("token", *S.trailing_dims(site))
        if kind in ("topk_ids", "topk_weights"):
            continue
        shape = (n, *(DIMS[d] for d in dims[1:]))
        data[site] = (dims, rng.standard_normal(shape).astype(np.float32), {"dtype": dtype})
    for i in moe_layers:
        ids, w = route(data[f"L{i}.router_logits"][1], DIMS["k"])
        data[f"L{i}.topk_ids"] = (("token", "k"), ids, {"dtype": "int64"})
        data[f"L{i}.topk_weights"] = (("token", "k"), w, {"dtype": dtype})
    coords = {
        "request": ("token", np.repeat(np.arange(requests), seq)),
        "position": ("token", np.tile(np.arange(seq), requests)),
        "token_id": ("token", rng.integers(0, DIMS["vocab"], n)),
        "step": ("token", np.zeros(n, dtype=np.int64)),
    }
    attrs = {"engine": "hf", "mode": "tensor", "dtype": dtype, "knobs": "{}", "versions": "{}",
             "model_hash": "synthetic", "complete": 1}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids (descending score) and renormalised softmax weights of router logits."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    w = np.take_along_axis(p, ids, axis=1)
    return ids.astype(np.int64), (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def noise(ds: xr.Dataset, rel: dict[str, float], seed: int = 1) -> xr.Dataset:
    """Copy of ``ds`` with independent noise of relative L2 size ``rel[site]`` per token row."""
    rng = np.random.default_rng(seed)
    out = ds.copy(deep=True)
    for site, r in rel.items():
        x = out[site].values.astype(np.float64)
        flat = x.reshape(len(x), -1)
        e = rng.standard_normal(flat.shape)
        e *= (r * np.linalg.norm(flat, axis=1, keepdims=True) / np.linalg.norm(e, axis=1, keepdims=True))
        out[site].values[...] = (flat + e).reshape(x.shape).astype(out[site].dtype)
    return out


def downstream(start: str, ds: xr.Dataset) -> list[str]:
    """Float sites of ``ds`` from ``start`` on, in execution order (where an error spreads)."""
    order = S.sort_sites([str(v) for v in ds.data_vars if ds[v].dtype.kind == "f"])
    return order[order.index(start):]
