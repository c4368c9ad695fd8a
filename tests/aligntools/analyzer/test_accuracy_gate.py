"""Accuracy gate (Dynamo same() style) and its pytest fixture."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from aligntools import Capture, assert_aligned
from aligntools.gates.accuracy import accuracy_gate
from tests.aligntools.analyzer.analyzer_synth import downstream, noise


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


def test_pytest_fixture_uses_project_tolerance(trio, tmp_path):
    """A user's suite registers the plugin in its conftest and sets a project tolerance file
    (k = 0.5): the candidate that passes the default k = 2 above must now fail."""
    ref, base, good, _ = trio
    paths = {name: str(Capture(ds).save(tmp_path / f"{name}.zarr"))
             for name, ds in (("ref", ref), ("base", base), ("good", good))}
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["aligntools.gates.pytest_plugin"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\naligntools_tolerance = tol.json\n")
    (tmp_path / "tol.json").write_text('{"default": {"k": 0.5, "atol": 0.0}}')
    (tmp_path / "test_user.py").write_text(textwrap.dedent(f"""
        import pytest
        from aligntools import Capture

        ref, base, good = (Capture.load(p) for p in ({paths['ref']!r}, {paths['base']!r}, {paths['good']!r}))

        def test_exact_candidate_passes(assert_aligned):
            assert assert_aligned(ref, base, ref).passes

        def test_project_tolerance_applies(assert_aligned):
            with pytest.raises(AssertionError, match="err_candidate > k"):
                assert_aligned(good, base, ref)
    """))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr
