"""``explore(comparison)``: an interactive view of a Comparison for JupyterLab.

A layer slider picks the layer whose sites are shown token by token; a metric dropdown and
a site filter (which site kind to follow across layers) drive the second heatmap. State
lives in plain Python (``Explorer.figure`` and the controls) and every change re-renders
synchronously, so it behaves the same with or without a browser (docs/machine.md:
headless ipywidgets fire observers but Output text is not captured). Without ipywidgets it
degrades to the static ``plot_comparison(cmp)`` figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from matplotlib.figure import Figure

from aligntools import sites as S
from aligntools.viz.plots import layer_heatmap, plot_comparison, token_heatmap

if TYPE_CHECKING:
    from aligntools.analyzer.comparison import Comparison

METRICS = ("rel_l2", "max_abs", "mean_abs", "cosine", "sqnr_db", "permille_err", "ulp_max")


class Explorer:
    """Widgets + the figure they drive. ``widget`` is the ipywidgets box to display."""

    def __init__(self, cmp: Comparison) -> None:
        import ipywidgets as w

        self.cmp = cmp
        kinds = [k for k in S.LAYER_SITES if k != "topk_ids"
                 and any(S.parse(s).kind == k for s in cmp.results)] or ["resid_post"]
        layers = [S.parse(s).layer for s in cmp.results if S.parse(s).layer is not None]
        first = cmp.first_divergence
        start = S.parse(first.site).layer if first and S.parse(first.site).layer is not None else 0
        self.layer_slider = w.IntSlider(value=start, min=0, max=max(layers, default=0), description="layer")
        self.metric = w.Dropdown(options=[m for m in METRICS if _has(cmp, m)], value="rel_l2",
                                 description="metric")
        self.kind = w.Dropdown(options=kinds, value="resid_post" if "resid_post" in kinds else kinds[0],
                               description="site")
        self.output = w.Output()
        self.figure: Figure | None = None
        for ctl in (self.layer_slider, self.metric, self.kind):
            ctl.observe(lambda _change: self.render(), names="value")
        self.widget = w.VBox([w.HBox([self.layer_slider, self.metric, self.kind]), self.output])
        self.render()

    def render(self) -> Figure:
        """Redraw for the current controls; returns (and keeps) the new figure."""
        fig = Figure(figsize=(13, 4.5), layout="constrained")
        left, right = fig.subplots(1, 2)
        layer_heatmap(self.cmp, self.layer_slider.value, self.metric.value, ax=left)
        token_heatmap(self.cmp, self.kind.value, self.metric.value, ax=right)
        self.figure = fig
        self.output.clear_output(wait=True)
        with self.output:
            from IPython.display import display

            display(fig)
        return fig

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def _has(cmp: Comparison, metric: str) -> bool:
    return any(metric in r.rows for r in cmp.results.values())


def explore(cmp: Comparison) -> Any:
    """An ``Explorer`` (interactive), or the static ``plot_comparison(cmp)`` figure without ipywidgets."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return plot_comparison(cmp)
    return Explorer(cmp)
