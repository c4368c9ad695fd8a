"""Accuracy gate (Dynamo same() style) and its pytest fixture."""

from __future__ import annotations

import numpy as np
import pytest

from aligntools import Capture, assert_aligned
from aligntools.accuracy_gate import accuracy_gate
from analyzer_synth import downstream, noise


@pytest.fixture(scope="module")
def trio(synth):
    """reference (as float64), baseline 1e-3 off it; candidates as far (ok) and 30x further (bad)."""
    ref = synth.copy(deep=True)
    for s in downstream("embed", ref):
        ref[s] = ref[s].astype(np.float64)
    floats = downstream("embed", synth)
    base = noise(synth, {s: 1e-3 for s in floats}, seed=11)
    good = noise(synth, {s: 1.2e-3 for s in floats}, seed=12)
    bad = noise(synth, {s: 1e-3 for s in floats} | {"L1.mlp_norm": 3e-2}, seed=13)
    return ref, base, good, bad


def test_comparable_kernel_passes(trio):
    ref, base, good, _ = trio
    report = assert_aligned(good, base, ref)
    assert report.passes and (report.table["err_candidate"] > 1e-3).all()


def test_degraded_kernel_fails_naming_the_site(trio):
    ref, base, _, bad = trio
    with pytest.raises(AssertionError, match="L1.mlp_norm"):
        assert_aligned(bad, base, ref)
    assert accuracy_gate(bad, base, ref).failures == ["L1.mlp_norm"]


def test_more_accurate_candidate_always_passes(trio):
    ref, base, _, _ = trio
    assert accuracy_gate(ref, base, ref).passes


def test_pytest_fixture_uses_project_tolerance(pytester, trio, tmp_path):
    ref, base, good, _ = trio
    paths = {}
    for name, ds in (("ref", ref), ("base", base), ("good", good)):
        paths[name] = Capture(ds).save(tmp_path / f"{name}.zarr")
    pytester.makeconftest('pytest_plugins = ["aligntools.pytest_plugin"]')
    pytester.makefile(".json", tol='{"default": {"k": 0.5, "atol": 0.0}}')
    pytester.makepyfile(f"""
        from aligntools import Capture
        def load(p):
            return Capture.load(p)
        def test_gate(assert_aligned):
            assert_aligned(load({str(paths['good'])!r}), load({str(paths['base'])!r}), load({str(paths['ref'])!r}))
    """)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    # k = 0.5 in the project file: the same candidate must now fail
    pytester.runpytest("-p", "no:cacheprovider", "-o", "aligntools_tolerance=tol.json").assert_outcomes(failed=1)
