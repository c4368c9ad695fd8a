"""Analyzer test fixtures: synthetic captures (analyzer_synth) and, for the planted-fault
tests, zoo models captured with the real Tracker."""

from __future__ import annotations

import pytest

from tests.aligntools.analyzer.analyzer_synth import make_capture


@pytest.fixture(scope="session")
def synth():
    """A 3-layer synthetic capture with one MoE layer (L1), 2 requests x 8 tokens."""
    return make_capture(n_layers=3, moe_layers=(1,))
