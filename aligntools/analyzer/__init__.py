"""Analyzer: diff two captures site by site (metrics, token alignment, first divergence,
routing diff, diagnosis) against noise-floor-relative tolerances. Its names are imported on first use
(``aligntools._lazy``): ``mlab diff``'s parser reads ``token_align.MODES`` without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aligntools._lazy import exports

_EXPORTS = {"Comparison": "aligntools.analyzer.comparison", "compare": "aligntools.analyzer.comparison",
            "Tolerance": "aligntools.analyzer.tolerance"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from aligntools.analyzer.comparison import Comparison, compare
    from aligntools.analyzer.tolerance import Tolerance
