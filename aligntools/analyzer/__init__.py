"""Analyzer: diff two captures site by site (metrics, token alignment, first divergence,
routing diff, diagnosis) against noise-floor-relative tolerances."""

from aligntools.analyzer.comparison import Comparison, compare
from aligntools.analyzer.tolerance import Tolerance

__all__ = ["Comparison", "Tolerance", "compare"]
