"""The layer explorer's heatmaps: bright means worse for every metric of its dropdown, the colour
bar says so, and on the demo-like gate comparison no metric's heatmap is flat or saturated
(cosine used to be solid black on a 1-8 scale, SQNR nearly flat)."""

from __future__ import annotations

import numpy as np
import pytest

from aligntools.viz.plots import badness, colour_norm, layer_heatmap, token_heatmap
from aligntools.viz.widgets import METRICS, _has


def _shown(fig) -> tuple[np.ndarray, object]:
    im = fig.axes[0].images[0]
    return np.ma.filled(im.get_array().astype(float), np.nan), im.norm


def test_every_dropdown_metric_spreads_over_the_colour_scale(gate):
    cmp = gate.comparison
    metrics = [m for m in METRICS if _has(cmp, m)]
    assert {"rel_l2", "cosine", "sqnr_db"} <= set(metrics)
    for metric in metrics:
        for fig in (token_heatmap(cmp, metric=metric), layer_heatmap(cmp, 1, metric=metric)):
            data, norm = _shown(fig)
            scaled = np.asarray(norm(data[np.isfinite(data)]), float)
            assert scaled.size, metric
            assert scaled.std() > 0.05, f"{metric}: flat heatmap (std {scaled.std():.3f} of the colour range)"
            saturated = np.mean((scaled <= 0.01) | (scaled >= 0.99))
            assert saturated < 0.9, f"{metric}: {saturated:.0%} of cells at an end of the colour scale"
            assert "bright = worse" in fig.axes[-1].get_ylabel(), metric


@pytest.mark.parametrize("metric, better, worse", [("cosine", 0.99999, 0.999), ("sqnr_db", 60.0, 20.0),
                                                   ("rel_l2", 1e-4, 1e-2)])
def test_bright_means_worse(metric, better, worse):
    mat, label = badness(np.array([[better, worse]]), metric)
    norm = colour_norm(mat)
    assert norm(mat[0, 1]) > norm(mat[0, 0]), (metric, label)


def test_errors_go_on_a_log_scale_and_signed_values_on_a_linear_one():
    """The demo's heatmap spanned less than 100x and, linear, was nearly all black (issue 66)."""
    assert type(colour_norm(np.array([1e-6, 1e-2]))).__name__ == "LogNorm"
    assert type(colour_norm(np.array([1e-3, 5e-3]))).__name__ == "LogNorm"
    assert type(colour_norm(np.array([0.0, 1e-3, 5e-3]))).__name__ == "LogNorm"  # zeros: darkest, masked
    assert type(colour_norm(np.array([-60.0, -20.0]))).__name__ == "Normalize"  # −SQNR
    assert type(colour_norm(np.array([2e-3, 2e-3]))).__name__ == "Normalize"  # one value: nothing to spread
