"""Routing diff: set vs order flips per layer, margins of flipped vs all tokens."""

from __future__ import annotations

import numpy as np

from aligntools.analyzer.routing_diff import routing_diff
from aligntools.analyzer.token_align import align
from tests.aligntools.analyzer.analyzer_synth import make_capture


def test_flip_fractions_and_margins():
    a = make_capture(n_layers=2, moe_layers=(0, 1))
    b = a.copy(deep=True)
    ids = b["L1.topk_ids"].values
    ids[0] = ids[0, ::-1]  # order-only flip
    ids[1, 1] = next(e for e in range(8) if e not in ids[1])  # set flip
    r = routing_diff(a, b, align(a, b))
    assert r.index.tolist() == [0, 1] and r.loc[0, "set_flip"] == 0 == r.loc[0, "order_flip"]
    assert r.loc[1, "set_flip"] == r.loc[1, "order_flip"] == 1 / 16
    logits = a["L1.router_logits"].values.astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p = -np.sort(-p / p.sum(1, keepdims=True), axis=1)
    assert r.loc[1, "margin_flipped"] == p[1, 1] - p[1, 2]
    assert r.loc[1, "margin_all"] == np.median(p[:, 1] - p[:, 2])


def test_without_router_logits_margins_are_unknown():
    a = make_capture(n_layers=1, moe_layers=(0,)).drop_vars("L0.router_logits")
    b = a.copy(deep=True)
    b["L0.topk_ids"].values[3, 0] = next(e for e in range(8) if e not in a["L0.topk_ids"].values[3])
    r = routing_diff(a, b, align(a, b))
    assert r.loc[0, "set_flip"] == 1 / 16 and np.isnan(r.loc[0, "near_tie"]) and np.isnan(r.loc[0, "margin_all"])
