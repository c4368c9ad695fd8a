"""Figures, widgets and HTML reports of Analyzer results (viz imports the analyzer, never the reverse)."""

from aligntools.viz.plots import growth_curve, layer_heatmap, plot_comparison, token_heatmap
from aligntools.viz.report import Report
from aligntools.viz.widgets import explore

__all__ = ["Report", "explore", "growth_curve", "layer_heatmap", "plot_comparison", "token_heatmap"]
