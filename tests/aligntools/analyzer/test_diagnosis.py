"""Diagnosis rules on planted synthetic error patterns (one rule each)."""

from __future__ import annotations

import numpy as np

import aligntools
from tests.aligntools.analyzer.analyzer_synth import downstream, noise, route


def later(ds, site, after=1e-3):
    """Relative noise ``after`` at every float site past ``site`` (the error spreading)."""
    return {s: after for s in downstream(site, ds)[1:]}


def causes(cmp):
    return [(f.cause, f.site) for f in cmp.diagnosis]


def test_rope_error_at_q_k_not_v(synth):
    rel = later(synth, "L1.v") | {"L1.q": 1e-3, "L1.k": 1e-3}
    cmp = aligntools.compare(synth, noise(synth, rel))
    assert cmp.first_divergence.site == "L1.q"
    assert causes(cmp)[0] == ("rope", "L1.q") and cmp.diagnosis[0].also == ("L1.k",)


def test_rmsnorm_precision_error_at_norm_with_clean_input(synth):
    rel = later(synth, "L2.attn_norm") | {"L2.attn_norm": 2e-3}
    cmp = aligntools.compare(synth, noise(synth, rel))
    assert causes(cmp)[0] == ("rmsnorm_precision", "L2.attn_norm")
    assert cmp.diagnosis[0].confidence > 0.9


def test_rmsnorm_eps_shows_as_per_token_rescaling(synth):
    b = noise(synth, later(synth, "L2.attn_norm"))
    scale = 1 + 1e-3 * np.linspace(0.5, 2, synth.sizes["token"])  # eps moves rms per token
    b["L2.attn_norm"].values[...] = (synth["L2.attn_norm"].values * scale[:, None]).astype(np.float32)
    cmp = aligntools.compare(synth, b)
    assert causes(cmp)[0] == ("rmsnorm_eps", "L2.attn_norm")


def test_attention_path_error_at_attn_out_only(synth):
    cmp = aligntools.compare(synth, noise(synth, later(synth, "L2.v") | {"L2.attn_out": 1e-3}))
    assert causes(cmp)[0] == ("attention_path", "L2.attn_out")


def test_lm_head_error_at_logits_with_clean_final_norm(synth):
    cmp = aligntools.compare(synth, noise(synth, {"logits": 1e-3, "logprobs": 1e-3, "entropy": 1e-3}))
    assert causes(cmp) == [("lm_head_precision", "logits")]
    assert cmp.table.loc["logits", "kl_mean"] > 0


def near_tie_flips(ds, layer: int, tokens: list[int], margin: float):
    """a: make ``tokens`` have a k-th/(k+1)-th score gap of ``margin`` (softmax space ~
    logit gap for small margins); b: swap those two experts in the top-k set."""
    a = ds.copy(deep=True)
    logits = a[f"L{layer}.router_logits"].values
    order = np.argsort(-logits, axis=1)
    for t in tokens:
        logits[t, order[t, 2]] = logits[t, order[t, 1]] - margin
    ids, w = route(logits, 2)
    a[f"L{layer}.topk_ids"].values[...] = ids
    a[f"L{layer}.topk_weights"].values[...] = w
    b = a.copy(deep=True)
    for t in tokens:
        b[f"L{layer}.topk_ids"].values[t, 1] = order[t, 2]
    return a, b


def test_router_precision_with_near_tie_flips(synth):
    a, b = near_tie_flips(synth, 1, [2, 5, 11], margin=1e-6)
    b = noise(b, later(a, "L1.router_logits") | {"L1.router_logits": 1e-3})
    cmp = aligntools.compare(a, b)
    assert cmp.first_divergence.site == "L1.router_logits"
    assert causes(cmp)[:2] == [("router_precision", "L1.router_logits"), ("unstable_topk", "L1.topk_ids")]
    r = cmp.routing.loc[1]
    assert r["set_flip"] == 3 / 16 and r["near_tie"] == 1.0 and r["margin_flipped"] < 1e-5 < r["margin_all"]


def test_large_margin_flips_are_real_disagreements(synth):
    a, b = near_tie_flips(synth, 1, [4], margin=0.5)
    cmp = aligntools.compare(a, b)
    assert ("routing_disagreement", "L1.topk_ids") in causes(cmp)
    assert cmp.routing.loc[1, "near_tie"] == 0.0
