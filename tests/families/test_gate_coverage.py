"""The alignment gate says what it compared, and refuses to pass on part of a model."""

from __future__ import annotations

import pytest

from aligntools.gates.alignment import site_coverage
from aligntools.gates.inputs import GateUsageError

TRAIN = ["embed", "L0.attn_norm", "L0.q", "L0.v", "L0.resid_post", "logits"]
INFER = ["embed", "L0.attn_norm", "L0.v", "L0.resid_post", "logits", "model.layers.0.mlp"]


def test_coverage_counts_and_names_the_one_sided_sites():
    both = [s for s in TRAIN if s in INFER]
    cov = site_coverage(TRAIN, INFER, both)
    assert (cov["compared"], cov["total"]) == (5, 7)
    assert cov["only_train"] == ["L0.q"] and cov["only_infer"] == ["model.layers.0.mlp"]


def test_excluded_sites_leave_the_count_and_a_typo_is_a_usage_error():
    cov = site_coverage(TRAIN, INFER, [s for s in TRAIN if s in INFER and s != "L0.v"], exclude=["L0.q", "L0.v"])
    assert (cov["compared"], cov["total"], cov["only_train"], cov["excluded"]) == (4, 5, [], ["L0.q", "L0.v"])
    with pytest.raises(GateUsageError, match="'L0.qq': no such site"):
        site_coverage(TRAIN, INFER, [], exclude=["L0.qq"])


@pytest.mark.slow
def test_ring_linear_gate_fails_on_one_sided_sites_until_they_are_excluded(zoo):
    """The zoo's BailingHybrid: transformers' capture has named sites now (MLA and linear
    attention found), minirl has q/k (and v of its MLA layers) that transformers' modules do
    not expose: the gate fails naming them, and passes once they are excluded by name."""
    from aligntools.gates.alignment import check_alignment

    path = zoo("tiny-ring-linear")
    result = check_alignment(path, infer="minirl:aligned", tokens=64, progress=False)
    one_sided = result.setup["sites"]["only_infer"]
    assert not result.passed and "captured on one side only" in result.verdict and "L0.q" in one_sided
    assert f"of {result.setup['sites']['total']} sites compared" in result.summary()
    again = check_alignment(path, infer="minirl:aligned", tokens=64, progress=False, exclude=one_sided)
    assert again.passed and again.setup["sites"]["compared"] >= 30, again.verdict
