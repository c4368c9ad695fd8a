"""The mismatch monitor's sentence, from constructed readings: growing, flat and shrinking arrays
each get the right words and the numbers they hold (``minirl.training.monitor_report``)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from minirl.training import monitor_report
from minirl.training.run_log import RunLog, load, monitor_dataset

STEPS = [0, 50, 100, 150, 200]
SITES = ["L0.attn_out", "L3.mlp_out"]


def readings(l3: list[float], flips: list[float] | None = None, first: list[str] | None = None) -> xr.Dataset:
    """Readings at ``STEPS``: L0.attn_out flat at 1e-3 (with a little noise), L3.mlp_out as given."""
    wobble = [1.0, 1.02, 0.99, 1.01, 0.98]
    rows = [{"step": s, "rel_l2": {"L0.attn_out": 1e-3 * w, "L3.mlp_out": e},
             "first_divergence": (first or ["L0.attn_out"] * 5)[i],
             "routing_flips": {"0": 0.01 * wobble[i], "3": (flips or [0.02] * 5)[i]}}
            for i, (s, e, w) in enumerate(zip(STEPS, l3, wobble))]
    return monitor_dataset(rows)


def test_growing_error_is_said_with_its_factor_and_interval():
    ds = readings([1e-3 * 2 ** (i + 0.05 * (-1) ** i) for i in range(5)])  # x2 per reading, with noise
    text = monitor_report.sentence(ds)
    fit = monitor_report.trend(ds["monitor_step"].values, np.log(ds["monitor_rel_l2"].values[:, 1]))
    factor = np.exp(fit.last - fit.first)
    assert 14 < factor < 18
    assert text.startswith(f"L3.mlp_out's error grew {factor:.2g}× from step 0 to 200 (95 % interval ")


def test_shrinking_error_says_shrank():
    ds = readings([1e-3 * 0.5 ** (i + 0.05 * (-1) ** i) for i in range(5)])
    assert monitor_report.sentence(ds).startswith("L3.mlp_out's error shrank to 0.06")


def test_flat_error_is_within_its_noise():
    ds = readings([2e-3 * w for w in (1.0, 1.1, 0.9, 1.05, 0.95)])
    text = monitor_report.sentence(ds)
    assert text.startswith("no site's error changed beyond its noise from step 0 to 200 (largest: ")
    assert "grew" not in text and "shrank" not in text


def test_rising_and_flat_routing_flips():
    rising = monitor_report.sentence(readings([1e-3] * 5, flips=[0.012, 0.02, 0.026, 0.031, 0.039]))
    fit = monitor_report.trend(np.array(STEPS), np.array([0.012, 0.02, 0.026, 0.031, 0.039]))
    assert f"routing flips in L3 rose from {100 * fit.first:.2g} % to {100 * fit.last:.2g} %" in rising
    flat = monitor_report.sentence(readings([1e-3] * 5, flips=[0.02, 0.025, 0.015, 0.022, 0.018]))
    assert "routing flips stayed within their noise" in flat
    falling = monitor_report.sentence(readings([1e-3] * 5, flips=[0.04, 0.03, 0.02, 0.01, 0.0]))
    assert "routing flips in L3 fell from 4 % to 0 %" in falling


def test_first_divergence_moves_stays_or_is_absent():
    moved = readings([1e-3] * 5, first=["L0.attn_out", "L0.attn_out", "L3.router_logits", "L3.router_logits",
                                        "L3.router_logits"])
    assert monitor_report.sentence(moved).endswith("first divergence moved from L0.attn_out to L3.router_logits at "
                                                   "step 100.")
    assert monitor_report.sentence(readings([1e-3] * 5)).endswith(
        "first divergence at L0.attn_out from step 0 to 200.")
    assert monitor_report.sentence(readings([1e-3] * 5, first=[""] * 5)).endswith(
        "no site diverged beyond the noise floor.")


def test_two_readings_are_too_few_for_a_trend():
    ds = readings([1e-3, 2e-3, 4e-3, 8e-3, 16e-3]).isel(monitor_step=[0, 1])
    assert monitor_report.sentence(ds).startswith("2 readings (from step 0 to 50) are too few to tell a trend from "
                                                  "noise")


def test_readings_round_trip_through_metrics_nc(tmp_path):
    log = RunLog(tmp_path / "metrics.nc")
    log.read({"step": 0, "rel_l2": {"L0.attn_out": 1e-3}, "first_divergence": "", "routing_flips": {}, "seconds": 0.5})
    assert log.unwritten and not (tmp_path / "metrics.nc").exists()  # kept, written with the step's row
    log.append(0, {"reward": 1.0})
    assert not log.unwritten
    ds = load(tmp_path / "metrics.nc")
    assert ds["monitor_rel_l2"].dims == ("monitor_step", "site")
    assert ds["site"].values.tolist() == ["L0.attn_out"] and ds["monitor_first_divergence"].values.tolist() == [""]
    assert "monitor_routing_flips" not in ds and ds["monitor_seconds"].values.tolist() == [0.5]


def test_a_run_without_readings_is_refused_by_name(tmp_path):
    RunLog(tmp_path / "metrics.nc").append(0, {"reward": 1.0})
    with pytest.raises(ValueError, match="holds no mismatch monitor readings: the run had monitor_every: 0"):
        monitor_report.load(tmp_path / "metrics.nc")


def test_one_reading_says_so():
    ds = readings([1e-3] * 5).isel(monitor_step=[0])
    assert monitor_report.sentence(ds) == ("1 reading (step 0) is too few to tell a trend from noise (3 or more: "
                                           "lower monitor_every or run longer); first divergence at L0.attn_out at "
                                           "step 0.")


def test_compare_growth_says_faster_only_beyond_both_intervals():
    growing = readings([1e-3 * 2 ** (i + 0.05 * (-1) ** i) for i in range(5)])
    flat = readings([2e-3 * w for w in (1.0, 1.1, 0.9, 1.05, 0.95)])
    text = monitor_report.compare_growth({"without a correction": growing, "with IcePop": flat})
    fit = monitor_report.median_growth(growing)
    assert text.startswith(f"the median site error changed {np.exp(fit.last - fit.first):.2g}× without a correction")
    assert text.endswith("the gap grew faster without a correction than with IcePop")
    same = monitor_report.compare_growth({"a": flat, "b": readings([2e-3 * w for w in (1.1, 0.9, 1.0, 0.95, 1.05)])})
    assert same.endswith("the intervals overlap: no run's gap moved measurably faster than another's")
    two = monitor_dataset([{"step": s, "rel_l2": {"L0.attn_out": 1e-3}, "first_divergence": "",
                            "routing_flips": {}} for s in (0, 5)])
    assert monitor_report.compare_growth({"a": two, "b": flat}).startswith("too few monitor readings")


def test_growth_per_site_kind_follows_that_kind_alone():
    """L3.mlp_out doubles every reading while L0.attn_out stays flat: per kind, the MLP output's
    median grows by the same factor as the site, the attention output's does not move."""
    growing = readings([1e-3 * 2 ** (i + 0.05 * (-1) ** i) for i in range(5)])
    flat = readings([2e-3 * w for w in (1.0, 1.1, 0.9, 1.05, 0.95)])
    assert monitor_report.site_kinds(growing) == ["attn_out", "mlp_out"]
    mlp = monitor_report.median_growth(growing, "mlp_out")
    site = monitor_report.trend(growing["monitor_step"].values, np.log(growing["monitor_rel_l2"].values[:, 1]))
    assert (mlp.first, mlp.last) == pytest.approx((site.first, site.last))
    attn = monitor_report.median_growth(growing, "attn_out")
    assert attn.low < 0 < attn.high and abs(attn.last - attn.first) < 0.05
    assert monitor_report.median_growth(growing, "router_logits") is None
    text = monitor_report.compare_growth({"without a correction": growing, "with IcePop": flat}, "attn_out")
    assert text.startswith("the median attn_out error changed ") and "intervals overlap" in text
    assert monitor_report.compare_growth({"a": growing, "b": flat}, "mlp_out").endswith("the gap grew faster a than b")


def test_kinds_figure_draws_one_panel_per_kind_and_one_line_per_run():
    growing = readings([1e-3 * 2 ** i for i in range(5)])
    fig = monitor_report.kinds_figure({"a": growing, "b": readings([2e-3] * 5)})
    assert [ax.get_title() for ax in fig.axes] == ["median attn_out error", "median mlp_out error"]
    lines = fig.axes[1].get_lines()
    assert len(lines) == 2 and lines[0].get_ydata().tolist() == pytest.approx([1e-3 * 2 ** i for i in range(5)])
