"""Tolerance policy: per-dtype defaults, measured noise floors, JSON overrides."""

from __future__ import annotations

import json

import pytest

import aligntools
from aligntools.analyzer.tolerance import DTYPE_RULES, Tolerance, canonical_dtype, coarser
from tests.aligntools.analyzer.analyzer_synth import downstream, noise


def test_limit_is_k_times_floor_plus_atol():
    r = DTYPE_RULES["bfloat16"]
    assert Tolerance().limit("L0.q", "torch.bfloat16") == pytest.approx(r.k * r.floor + r.atol)
    t = Tolerance.from_noise_floor({"L0.q": 1e-3}, k=5.0, atol=1e-6)
    assert t.limit("L0.q", "float32") == pytest.approx(5e-3 + 1e-6)
    assert t.limit("L1.q", "float32") == pytest.approx(5 * DTYPE_RULES["float32"].floor + 1e-6)  # no floor measured


def test_dtype_names_and_coarser():
    assert canonical_dtype("bf16") == canonical_dtype("torch.bfloat16") == "bfloat16"
    assert canonical_dtype(None) == "float32"
    assert coarser("float32", "bfloat16") == "bfloat16" and coarser("float64", "fp16") == "float16"


def test_json_overrides_sites_over_default_over_dtype(tmp_path):
    f = tmp_path / "tol.json"
    f.write_text(json.dumps({"default": {"atol": 0.0}, "dtypes": {"bf16": {"floor": 0.1}},
                             "sites": {"L*.router_logits": {"k": 10.0}}}))
    t = Tolerance.load(f)
    assert t.limit("L3.router_logits", "bfloat16") == pytest.approx(10 * 0.1)
    assert t.limit("L3.q", "bfloat16") == pytest.approx(DTYPE_RULES["bfloat16"].k * 0.1)


@pytest.mark.parametrize("spec", [{"defaults": {}}, {"sites": {"x": {"rtol": 1}}}])
def test_bad_tolerance_files_are_rejected(spec):
    with pytest.raises(ValueError):
        Tolerance.from_dict(spec)


def test_reference_sets_the_noise_floor(synth):
    """a is 1e-3 from the reference: an a-vs-b error of 1e-3 is within k x floor and passes,
    while the same error without a reference fails the fp32 default floor."""
    floats = downstream("embed", synth)
    ref = noise(synth, {s: 1e-3 for s in floats}, seed=5)
    b = noise(synth, {s: 1e-3 for s in floats}, seed=6)
    assert not aligntools.compare(synth, b).passes
    cmp = aligntools.compare(synth, b, reference=ref)
    assert cmp.passes
    k = DTYPE_RULES["float32"].k
    assert cmp.table.loc["L1.q", "limit"] == pytest.approx(k * 1e-3 + DTYPE_RULES["float32"].atol, rel=1e-3)
    assert aligntools.compare(synth, b, tolerance=Tolerance.from_noise_floor({}, k=1000.0)).passes
