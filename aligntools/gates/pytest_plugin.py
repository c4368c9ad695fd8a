"""pytest plugin: an ``assert_aligned`` fixture for accuracy gates in a user's test suite.

Register it in a conftest.py with ``pytest_plugins = ["aligntools.gates.pytest_plugin"]``; then

    def test_my_rmsnorm_kernel(assert_aligned):
        assert_aligned(candidate_capture, baseline_capture, fp64_capture)

A project-wide tolerance file (JSON, see ``aligntools.analyzer.tolerance``) is set with the ini
option ``aligntools_tolerance`` (or ``-o aligntools_tolerance=path`` on the command line),
so CI thresholds live in one reviewed file instead of in every test.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from aligntools.gates.accuracy import GateReport
from aligntools.gates.accuracy import assert_aligned as _assert_aligned
from aligntools.analyzer.tolerance import Tolerance


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("aligntools_tolerance", "JSON tolerance file used by the assert_aligned fixture "
                  "(relative to the rootdir)", default="")


@pytest.fixture
def assert_aligned(request: pytest.FixtureRequest) -> Callable[..., GateReport]:
    """``assert_aligned(candidate, baseline, reference, **kw)`` with the project tolerance."""
    path = request.config.getini("aligntools_tolerance")
    tol = Tolerance.load(Path(request.config.rootpath) / path) if path else None
    return partial(_assert_aligned, tolerance=tol)
