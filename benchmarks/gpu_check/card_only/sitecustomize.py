"""Make this interpreter see only what a lent card has: put this folder first on ``PYTHONPATH``.

    PYTHONPATH=benchmarks/gpu_check/card_only python -m benchmarks.gpu_check --dry-run

A module of an installed distribution outside the card's set (``wheels.CARD`` and their
dependencies) and the carried wheels (``wheels.carried_names``) is not found, as it would not be
there; the standard library and the project's own packages are untouched. pytest loads only the
plugins the card has (plugins of hidden distributions would fail to import at its start).
Why: the dry run then proves that the check needs nothing beyond the wheels that travel.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from importlib.metadata import packages_distributions
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository, for the lists below
from benchmarks.gpu_check.wheels import _norm, card_closure, carried_names  # noqa: E402

ALLOWED = card_closure() | carried_names()
OWNERS = {top: {_norm(d) for d in dists} for top, dists in packages_distributions().items()}
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ["PYTEST_PLUGINS"] = "pytest_benchmark.plugin,pytest_timeout"


class CardOnly:
    """The path finder, minus the modules of distributions the card does not have: for them it
    answers "not found", as an absent package would (so optional imports take their fallback)."""

    def __init__(self, finder: type) -> None:
        self.finder = finder

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        dists = OWNERS.get(name.partition(".")[0])
        if dists and "mismatch-lab" not in dists and not dists & ALLOWED:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr: str) -> object:  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, attr)


sys.meta_path[:] = [CardOnly(f) if f is PathFinder else f for f in sys.meta_path]
