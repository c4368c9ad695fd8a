"""``mlab plot``: runs that differ only in seed are one band named by their config, not their seed;
50 runs get 50 colours and a legend beside the panels; what is not a run log, and an ``--out`` that
cannot take a figure, are refused with a message naming why."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr
import yaml

from labs import cli
from minirl.training import plot
from minirl.training.run_log import RunLog


def _run(path, rewards: list[float], **config) -> str:
    """A run directory as ``minirl.train`` leaves it: metrics.nc (one row per step) and config.yaml."""
    path.mkdir(parents=True)
    RunLog(path / "metrics.nc", [{"step": i, "reward": r, "grad_norm": 1.0} for i, r in enumerate(rewards)]).flush()
    (path / "config.yaml").write_text(yaml.safe_dump({"correction": "icepop", "lr": 1e-3, "seed": 0,
                                                      "out_dir": str(path), **config}))
    return str(path)


def test_seeds_of_one_config_are_one_band_named_by_the_config(tmp_path):
    """Seeds 0-2 of IcePop at 0.2 / 0.4 / 0.6 on step 0: mean 0.4 and 0.4 ± t(0.975, 2) * 0.2 / sqrt(3)."""
    icepop = [_run(tmp_path / f"icepop-{s}", [0.2 + 0.2 * s, 0.5 + 0.1 * s], seed=s) for s in range(3)]
    tis = _run(tmp_path / "tis", [0.3, 0.3], correction="tis")
    assert plot.seed_groups([*icepop, tis]) == [("correction=icepop (3 seeds)", [0, 1, 2]), ("correction=tis", [3])]
    assert plot.legend_labels([*icepop, tis])[2:] == ["correction=icepop (3 seeds)", "correction=tis"]
    ax = plot.figure([*icepop, tis]).axes[0]  # training reward
    band, single = ax.get_lines()
    assert band.get_ydata().tolist() == pytest.approx([0.4, 0.6]) and single.get_ydata().tolist() == [0.3, 0.3]
    (shade,) = ax.collections  # only the band is shaded
    half = 4.302653 * 0.2 / math.sqrt(3)
    vertices = shade.get_paths()[0].vertices  # (step, y) around the band
    for step, mean, h in [(0, 0.4, half), (1, 0.6, 0.1 / 0.2 * half)]:  # step 1: std 0.1, not 0.2
        y = vertices[vertices[:, 0] == step, 1]
        assert (y.min(), y.max()) == pytest.approx((mean - h, mean + h), rel=1e-5)


def test_runs_of_one_seed_and_different_configs_still_overlay(tmp_path):
    runs = [_run(tmp_path / c, [0.1, 0.2], correction=c) for c in ("none", "tis")]
    assert plot.seed_groups(runs) == [("correction=none", [0]), ("correction=tis", [1])]
    assert not plot.figure(runs).axes[0].collections


@pytest.mark.parametrize(("df", "t"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)])
def test_t_quantile_matches_the_table(df, t):
    assert plot.t_quantile(0.975, df) == pytest.approx(t, abs=2e-4)


def test_band_aligns_steps_and_has_no_interval_from_one_seed():
    steps, mean, ci = plot.band([(np.array([0, 1, 2]), np.array([1.0, np.nan, 3.0])),
                                 (np.array([0, 2]), np.array([3.0, 5.0]))])
    assert steps.tolist() == [0, 2] and mean.tolist() == [2.0, 4.0]
    steps, mean, ci = plot.band([(np.array([0, 1]), np.array([1.0, 2.0])), (np.array([0]), np.array([3.0]))])
    assert steps.tolist() == [0, 1] and ci[:, 1].tolist() == [2.0, 2.0]  # step 1: one seed, the mean itself


def test_fifty_runs_get_fifty_colours_and_a_legend_beside_the_panels(tmp_path):
    """PL11: with 4 legend columns under the panels, 50 runs covered the gradient-norm panel in 10 colours."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    runs = [_run(tmp_path / f"r{i}", [0.1 * (i % 7), 0.2], lr=10.0 ** (-3 - i / 10)) for i in range(50)]
    fig = plot.figure(runs)
    assert len({tuple(line.get_color()) for line in fig.axes[0].get_lines()}) == 50
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert len(fig.legends[0].get_texts()) == 50
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_tightbbox(renderer)), ax.get_title()
    png = tmp_path / "fifty.png"
    assert plot.plot_runs(runs, png) == png and png.stat().st_size > 0


def test_a_capture_named_metrics_nc_is_refused_by_what_it_is(tmp_path, capsys):
    """PL04: a capture copied to metrics.nc failed with "KeyError: 'row'"."""
    run = tmp_path / "capture"
    run.mkdir()
    xr.Dataset({"logits": (("token", "vocab"), np.zeros((3, 4), np.float32))}).to_netcdf(
        run / "metrics.nc", engine="h5netcdf")
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "fig.png")]) == 2
    err = capsys.readouterr().err
    assert "is not a minirl run log" in err and "aligntools capture" in err and "KeyError" not in err
    assert not (tmp_path / "fig.png").exists()


def test_pl06_a_config_with_aliases_beside_a_real_log_is_refused_at_once(tmp_path, capsys):
    """PL06: a 757-byte "billion laughs" config.yaml beside a real log hung mlab plot (killed at 120 s)."""
    run = _run(tmp_path / "laughs", [0.1, 0.2])
    laughs = "task_kwargs:\n" + "".join(
        f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9))
    (tmp_path / "laughs" / "config.yaml").write_text(laughs)
    assert cli.main(["plot", run, "--out", str(tmp_path / "fig.png")]) == 2
    err = capsys.readouterr().err
    assert f"{run}/config.yaml: line 2: YAML anchors and aliases (& and *) are not accepted" in err
    assert not (tmp_path / "fig.png").exists()


def test_out_under_a_file_says_not_a_directory(tmp_path, capsys):
    """PL07: ``--out /etc/passwd/x.png`` said "[Errno 17] File exists"."""
    run = _run(tmp_path / "run", [0.1, 0.2])
    blocker = tmp_path / "passwd"
    blocker.write_text("root\n")
    assert cli.main(["plot", run, "--out", str(blocker / "x.png")]) == 2
    assert f"{blocker} is not a directory" in capsys.readouterr().err and blocker.read_text() == "root\n"


def test_out_that_is_a_directory_or_has_no_format_is_refused(tmp_path, capsys):
    """PL09: ``--out <existing dir>`` printed the directory and wrote ``<dir>.png`` beside it."""
    run = _run(tmp_path / "run", [0.1, 0.2])
    target = tmp_path / "figs"
    target.mkdir()
    assert cli.main(["plot", run, "--out", str(target)]) == 2
    assert "it is a directory" in capsys.readouterr().err
    assert cli.main(["plot", run, "--out", str(tmp_path / "curves")]) == 2
    assert "end the name in .png, .pdf or .svg" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figs", "run"] and not any(target.iterdir())
    assert cli.main(["plot", run, "--out", str(target / "curves.png")]) == 0
    assert capsys.readouterr().out.strip() == str(target / "curves.png") and (target / "curves.png").stat().st_size
