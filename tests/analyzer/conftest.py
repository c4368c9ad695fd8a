"""Analyzer test fixtures: synthetic captures (analyzer_synth) and, for the planted-fault
tests, zoo models captured with the real Tracker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The suite runs with --import-mode=importlib (no test folder on sys.path): make this
# folder's helper module importable by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyzer_synth import make_capture  # noqa: E402


@pytest.fixture(scope="session")
def synth():
    """A 3-layer synthetic capture with one MoE layer (L1), 2 requests x 8 tokens."""
    return make_capture(n_layers=3, moe_layers=(1,))
