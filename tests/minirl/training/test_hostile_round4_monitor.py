"""Hostile inputs, round 4 (issue 48), the mismatch monitor's sentence and heatmap, and ``mlab
plot``'s legend: NaN and inf readings are the worst case, said first and drawn in their cells;
a log no monitor could have written is refused by name when read."""

from __future__ import annotations

import math

import pytest
import xarray as xr
import yaml

from labs import cli
from minirl.training import monitor_report, plot
from minirl.training.run_log import RunLog, load, monitor_dataset

SITES = ("L0.attn_out", "L0.mlp_out")


def readings(values: list[float] | float, steps: tuple[int, ...] = (0, 1, 2), first: str = "") -> xr.Dataset:
    """Readings at ``steps``, every site at ``values[i]`` (one value: at every step)."""
    per = values if isinstance(values, list) else [values] * len(steps)
    return monitor_dataset([{"step": s, "rel_l2": dict.fromkeys(SITES, v), "first_divergence": first,
                             "routing_flips": {}} for s, v in zip(steps, per)])


def run_with(tmp_path, ds: xr.Dataset) -> str:
    """A run directory whose metrics.nc holds one RL step's row and ``ds`` as written."""
    run = tmp_path / "run"
    run.mkdir()
    RunLog(run / "steps.nc", [{"step": 0, "reward": 1.0}]).flush()
    xr.merge([load(run / "steps.nc"), ds]).to_netcdf(run / "metrics.nc", engine="h5netcdf")
    return str(run)


def plot_sites(tmp_path, ds: xr.Dataset, capsys) -> tuple[int, str]:
    rc = cli.main(["plot", run_with(tmp_path, ds), "--sites", "--out", str(tmp_path / "sites.png")])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_PS03_nan_readings_are_the_worst_case(tmp_path, capsys):
    rc, text = plot_sites(tmp_path, readings(math.nan), capsys)
    assert rc == 0, text
    assert "every reading is not finite (NaN; L0.attn_out, L0.mlp_out, first at step 0)" in text
    assert "blew up" in text and "no site had a nonzero error" not in text
    assert "no site diverged" not in text and "no first divergence was named" in text


def test_PS06_inf_readings_are_the_worst_case_and_drawn_in_their_cells():
    ds = readings(math.inf)
    assert monitor_report.sentence(ds).startswith("every reading is not finite (inf; L0.attn_out, L0.mlp_out, ")
    heat = monitor_report.figure(ds).axes[0]
    assert [t.get_text() for t in heat.texts] == ["inf"] * 6  # 3 steps x 2 sites, each cell says so
    nan = monitor_report.figure(readings([1e-3, math.nan, 1e-3])).axes[0]
    assert [(t.get_text(), t.get_position()) for t in nan.texts] == [("NaN", (1, 0)), ("NaN", (1, 1))]


def test_PS03_some_non_finite_readings_are_said_beside_the_trend():
    ds = readings([1e-3, 2e-3, 4e-3, math.nan], steps=(0, 1, 2, 3))
    text = monitor_report.sentence(ds)
    assert text.startswith("2 of 8 readings are not finite (NaN; L0.attn_out, L0.mlp_out, first at step 3)")
    assert "error grew" in text or "changed beyond its noise" in text


def test_PS05_negative_errors_are_refused_as_a_damaged_log(tmp_path, capsys):
    rc, text = plot_sites(tmp_path, readings(-1.0), capsys)
    assert rc != 0
    assert "monitor_rel_l2 holds 6 values outside [0, inf] (-1 at step 0)" in text and "damaged" in text


def test_PS08_a_log_with_no_site_says_so(tmp_path, capsys):
    ds = monitor_dataset([{"step": s, "rel_l2": {}, "first_divergence": "", "routing_flips": {}} for s in range(3)])
    rc, text = plot_sites(tmp_path, ds, capsys)
    assert rc != 0 and "the log has no site" in text, text


def test_PS09_reversed_steps_are_sorted(tmp_path):
    ds = readings([4e-3, 2e-3, 1e-3], steps=(2, 1, 0))
    loaded = monitor_report.load(run_with(tmp_path, ds) + "/metrics.nc")
    assert loaded["monitor_step"].values.tolist() == [0, 1, 2]
    assert loaded["monitor_rel_l2"].values[:, 0].tolist() == [1e-3, 2e-3, 4e-3]
    assert "from step 0 to 2" in monitor_report.sentence(loaded)


def test_PS10_a_first_divergence_in_a_layer_the_log_lacks_is_named(tmp_path):
    ds = readings([1e-3, 2e-3, 4e-3], first="L77.nothing")
    text = monitor_report.sentence(monitor_report.load(run_with(tmp_path, ds) + "/metrics.nc"))
    assert "first divergence at L77.nothing (a layer this log has no readings of) from step 0 to 2" in text


def test_PS11_a_missing_variable_is_named(tmp_path, capsys):
    rc, text = plot_sites(tmp_path, readings(1e-3).drop_vars("monitor_first_divergence"), capsys)
    assert rc != 0 and "not a complete monitor log: no monitor_first_divergence" in text, text


def test_PS12_readings_stored_as_strings_are_refused(tmp_path, capsys):
    ds = readings(1e-3)
    ds["monitor_rel_l2"] = ds["monitor_rel_l2"].astype(str).astype(object)
    rc, text = plot_sites(tmp_path, ds, capsys)
    assert rc != 0 and "monitor_rel_l2 must be numbers" in text and "UFuncTypeError" not in text, text


def _copy(path, lr: float, seed: int) -> str:
    path.mkdir(parents=True)
    RunLog(path / "metrics.nc", [{"step": i, "reward": 0.1 * i, "grad_norm": 1.0} for i in range(3)]).flush()
    (path / "config.yaml").write_text(yaml.safe_dump({"correction": "icepop", "lr": lr, "seed": seed,
                                                      "out_dir": str(path)}))
    return str(path)


def test_PL11b_copies_of_one_seed_are_runs_not_seeds(tmp_path):
    runs = [_copy(tmp_path / "a", 1e-4, 0), _copy(tmp_path / "b", 1e-4, 0), _copy(tmp_path / "c", 1e-3, 0),
            _copy(tmp_path / "d", 1e-3, 1), _copy(tmp_path / "e", 1e-2, 0), _copy(tmp_path / "f", 1e-2, 0),
            _copy(tmp_path / "g", 1e-2, 1)]
    labels = [label for label, _ in plot.seed_groups(runs)]
    assert labels == ["lr=0.0001 (2 runs)", "lr=0.001 (2 seeds)", "lr=0.01 (3 runs, 2 seeds)"]
