"""First divergence: robust to noise, finds the jump, explains it with numbers."""

from __future__ import annotations

import numpy as np

import aligntools
from aligntools.analyzer.divergence import upstream_sites
from tests.aligntools.analyzer.analyzer_synth import downstream, make_capture, noise


def test_identical_captures_do_not_diverge(synth):
    cmp = aligntools.compare(synth, synth.copy(deep=True))
    assert cmp.first_divergence is None and cmp.passes and cmp.diagnosis == []


def test_independent_fp32_noise_everywhere_does_not_diverge(synth):
    floats = downstream("embed", synth)
    cmp = aligntools.compare(synth, noise(synth, {s: 1e-7 for s in floats}))
    assert cmp.table.loc[floats, "rel_l2"].min() > 5e-8  # the noise is really there
    assert cmp.first_divergence is None and cmp.passes


def test_jump_is_found_where_error_starts_not_where_it_is_largest(synth):
    sites = downstream("L1.attn_norm", synth)
    rel = {s: 1e-4 * 1.3 ** i for i, s in enumerate(sites)}  # grows steadily afterwards
    cmp = aligntools.compare(synth, noise(synth, rel))
    fd = cmp.first_divergence
    assert fd.site == "L1.attn_norm" and fd.factor == np.inf
    assert fd.upstream == ("L0.resid_post",) and "L0.resid_post=0" in fd.reason
    assert not cmp.passes and cmp.failures[0] == "L1.attn_norm"


def test_growth_from_a_noisy_input_is_not_a_divergence(synth):
    """Upstream already at 1e-4: a 2x step at L2.q is growth, a 50x step at L2.attn_out is not."""
    rel = {s: 1e-4 for s in downstream("L1.attn_norm", synth)}
    rel |= {"L2.q": 2e-4, "L2.attn_out": 5e-3}
    cmp = aligntools.compare(synth, noise(synth, rel))
    jumps = cmp.growth.index[cmp.growth["jumps"]].tolist()
    assert jumps == ["L1.attn_norm", "L2.attn_out"]
    assert cmp.growth.loc["L2.attn_out", "growth"] > 20


def test_nan_on_one_side_diverges_with_a_finding(synth):
    bad = synth.copy(deep=True)
    bad["L2.mlp_out"].values[3, 1] = np.nan
    cmp = aligntools.compare(synth, bad)
    assert cmp.first_divergence.site == "L2.mlp_out"
    assert cmp.diagnosis[0].cause == "nonfinite" and "1 elements" in cmp.diagnosis[0].evidence
    assert cmp.per_token("L2.mlp_out")["nonfinite_mismatch"].tolist()[3] == 1


def test_upstream_walks_past_uncaptured_sites():
    full = [s for s in make_capture(n_layers=2).data_vars]
    assert upstream_sites("L1.attn_norm", full) == ("L0.resid_post",)
    assert upstream_sites("L1.attn_out", full) == ("L1.q", "L1.k", "L1.v")
    assert upstream_sites("L0.attn_norm", full) == ("embed",)
    assert upstream_sites("final_norm", full) == ("L1.resid_post",)
    sparse = ["embed", "L0.resid_post", "L1.resid_post", "logits"]
    assert upstream_sites("L1.resid_post", sparse) == ("L0.resid_post",)
    assert upstream_sites("logits", sparse) == ("L1.resid_post",)
    assert upstream_sites("model.layers.0.foo", ["embed", "model.layers.0.foo"]) == ("embed",)
