"""Figures come back as objects (headless); the explorer re-renders on widget changes."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import aligntools
from aligntools.viz.plots import growth_curve, plot_comparison, token_heatmap
from aligntools.viz.widgets import Explorer, explore
from tests.aligntools.analyzer.analyzer_synth import downstream, noise


@pytest.fixture(scope="module")
def cmp(synth):
    return aligntools.compare(synth, noise(synth, {s: 1e-3 for s in downstream("L1.attn_norm", synth)}))


def test_plot_returns_growth_curve_and_heatmap(cmp):
    fig = plot_comparison(cmp)
    assert isinstance(fig, Figure)
    titles = [ax.get_title() for ax in fig.axes]
    assert any(t.startswith("error growth") for t in titles) and "rel_l2 at L*.resid_post" in titles
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "first divergence: L1.attn_norm" in legend


def test_heatmap_shows_error_only_from_the_divergent_layer(cmp):
    fig = token_heatmap(cmp)
    data = fig.axes[0].images[0].get_array()
    assert data.shape == (16, 3)
    assert data.mask[:, 0].all() and not data.mask[:, 1:].any()  # layer 0 exact (masked), 1-2 not


def test_growth_curve_metric_choice(cmp):
    fig = growth_curve(cmp, metric="max_abs")
    assert fig.axes[0].get_ylabel() == "max_abs"


def test_explorer_rerenders_on_control_changes(cmp):
    ex = explore(cmp)
    assert isinstance(ex, Explorer) and ex.layer_slider.value == 1  # starts at the divergence
    first = ex.figure
    ex.layer_slider.value = 2
    assert ex.figure is not first and ex.figure.axes[0].get_title() == "rel_l2 in layer 2"
    ex.metric.value = "cosine"
    ex.kind.value = "attn_norm"
    assert "cosine at L*.attn_norm" in [ax.get_title() for ax in ex.figure.axes]
    assert set(ex.metric.options) >= {"rel_l2", "ulp_max", "sqnr_db"}


def test_per_token_metrics_as_xarray(cmp):
    ds = cmp.to_xarray()
    assert ds["rel_l2"].dims == ("site", "token") and ds.sizes["token"] == 16
    assert float(ds["rel_l2"].sel(site="L0.q").max()) == 0 and float(ds["rel_l2"].sel(site="L1.q").min()) > 0
    assert ds["kl"].sel(site="L0.q").isnull().all() and ds["layer"].sel(site="logits") == -1
    with pytest.raises(KeyError, match="not compared"):
        cmp.per_token("L9.q")


def test_explore_degrades_to_a_static_figure_without_ipywidgets(cmp, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ipywidgets", None)  # import now fails
    fig = explore(cmp)
    assert isinstance(fig, Figure) and len(fig.axes) >= 2
