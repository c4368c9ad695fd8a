"""The diagnosis names the cause of an MoE layer's error spike (issue 15: the demo's ×13
``L2.mlp_out`` spike went unexplained): expert flips when the flipped tokens carry the
error, the expert path when they do not."""

from __future__ import annotations

import numpy as np
import pytest

import aligntools
from tests.aligntools.analyzer.analyzer_synth import downstream, make_capture, noise, route

FLIPPED = [2, 5, 11]


@pytest.fixture(scope="module")
def flipped_pair():
    """a, b with L1's top-k set flipped at near-ties for FLIPPED tokens; no other error yet."""
    a = make_capture(n_layers=3, moe_layers=(1,))
    logits = a["L1.router_logits"].values
    order = np.argsort(-logits, axis=1)
    for t in FLIPPED:
        logits[t, order[t, 2]] = logits[t, order[t, 1]] - 1e-6
    ids, w = route(logits, 2)
    a["L1.topk_ids"].values[...], a["L1.topk_weights"].values[...] = ids, w
    b = a.copy(deep=True)
    for t in FLIPPED:
        b["L1.topk_ids"].values[t, 1] = order[t, 2]
    return a, b


def with_mlp_error(a, b, per_token_rel: np.ndarray):
    """b with L1.mlp_out off by ``per_token_rel`` (relative, per token) and 1e-3 after it."""
    out = noise(b, {s: 1e-3 for s in downstream("L1.mlp_out", a)[1:]})
    x = a["L1.mlp_out"].values
    d = np.random.default_rng(3).standard_normal(x.shape)
    d *= (per_token_rel * np.linalg.norm(x, axis=1) / np.linalg.norm(d, axis=1))[:, None]
    out["L1.mlp_out"].values[...] = (x + d).astype(np.float32)
    return out


def test_spike_on_flipped_tokens_is_put_down_to_the_flips(flipped_pair):
    a, b = flipped_pair
    rel = np.zeros(a.sizes["token"])
    rel[FLIPPED] = 0.5
    cmp = aligntools.compare(a, with_mlp_error(a, b, rel))
    assert cmp.first_divergence.site == "L1.mlp_out"
    found = {f.cause: f for f in cmp.diagnosis}
    flip = found["expert_flip"]
    assert flip.site == "L1.mlp_out" and "mlp_path" not in found
    assert "3 of 16 tokens" in flip.evidence and "carry 100% of the error" in flip.evidence
    assert flip.confidence > 0.9
    assert any(f.site == "L1.topk_ids" for f in cmp.diagnosis)  # the flips themselves are named too


def test_spike_spread_over_all_tokens_is_the_expert_path(flipped_pair):
    a, b = flipped_pair
    cmp = aligntools.compare(a, with_mlp_error(a, b, np.full(a.sizes["token"], 0.1)))
    causes = [(f.cause, f.site) for f in cmp.diagnosis]
    assert ("mlp_path", "L1.mlp_out") in causes and "expert_flip" not in dict(causes)


def test_growth_is_stated_in_every_jump_finding(flipped_pair):
    a, b = flipped_pair
    cmp = aligntools.compare(a, with_mlp_error(a, b, np.full(a.sizes["token"], 0.1)))
    mlp = next(f for f in cmp.diagnosis if f.cause == "mlp_path")
    assert "from a clean input" in mlp.evidence  # mlp_norm and topk_weights are exact here


def test_without_per_token_ids_the_finding_says_it_cannot_tell(flipped_pair):
    """Stats-mode expert ids carry no per-token flips: the spike is still named, with that caveat."""
    from aligntools.analyzer.diagnosis import diagnose

    a, b = flipped_pair
    rel = np.zeros(a.sizes["token"])
    rel[FLIPPED] = 0.5
    cmp = aligntools.compare(a, with_mlp_error(a, b, rel))

    def no_ids(site):
        rows = cmp.per_token(site)
        return rows.drop(columns=["set_flip"]) if site.endswith("topk_ids") else rows

    flip = next(f for f in diagnose(cmp.growth, cmp.table, cmp.routing, no_ids) if f.cause == "expert_flip")
    assert flip.site == "L1.mlp_out" and "cannot be told" in flip.evidence and flip.confidence < 0.5
