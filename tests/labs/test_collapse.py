"""``labs.reproduce --only collapse``: the arms, the verdict rule, the smoothing, the full-size setup."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from labs import collapse_lab, reproduce
from minirl.training.plot import smoothed
from minirl.training.train_config import TrainConfig


def _curves(**arms: tuple[np.ndarray, np.ndarray]) -> xr.Dataset:
    """[arm, seed, step] curves of one seed from (reward, grad_norm_max) per arm."""
    steps = len(next(iter(arms.values()))[0])
    data = {}
    for var, i in (("reward", 0), ("grad_norm_max", 1)):
        data[var] = (("arm", "seed", "step"), np.stack([[a[i]] for a in arms.values()]))
    data["abs_dprob_max"] = (("arm", "seed", "step"), np.full((len(arms), 1, steps), 0.1))
    return xr.Dataset(data, coords={"arm": list(arms), "seed": [0], "step": np.arange(steps)})


def test_the_verdict_follows_its_rule():
    steps = np.arange(200)
    rising = np.minimum(steps / 100, 1.0) * 0.6  # to 0.6, held
    falling = np.where(steps < 150, rising, 0.1)  # peak 0.6, last tenth 0.1 < 0.3
    flat_grad, spiky = np.ones(200), np.where(steps == 190, 50.0, 1.0)
    table = collapse_lab.verdict(_curves(none=(falling, flat_grad), tis=(rising, spiky), icepop=(rising, flat_grad)))
    assert table["collapsed"].tolist() == [True, True, False]
    assert table["reward_collapsed"].tolist() == [True, False, False] and table["grad_spike"].tolist() == [False, True, False]
    assert table.loc[("tis", 0), "grad_spike_x_median"] == pytest.approx(50.0)
    assert table.loc[("none", 0), "reward_last_tenth"] == pytest.approx(0.1)
    text = collapse_lab.sentence(table)  # tis's spike is named apart: its reward held
    assert text.startswith("By reward, Ring-1T's pattern shows: none seed 0 (reward 0.10 in the last tenth vs a smoothed "
                           "peak 0.60) collapses, no corrected run does.")
    assert ("The rule also flags, by a gradient spike alone, tis seed 0 (grad norm 50x its median; reward held at 0.60 "
            "in the last tenth): a spike, not a collapse of the reward.") in text
    assert "tis: reward collapsed in 0 of 1 seed, gradient spike in 1" in text
    falls_too = collapse_lab.verdict(_curves(none=(falling, flat_grad), tis=(falling, flat_grad),
                                             icepop=(rising, flat_grad)))
    assert "not as Ring-1T's pattern (uncorrected only): none seed 0" in collapse_lab.sentence(falls_too)
    paper = collapse_lab.verdict(_curves(none=(falling, flat_grad), tis=(rising, flat_grad),
                                         icepop=(rising, flat_grad)))
    text = collapse_lab.sentence(paper)
    assert "none: reward collapsed in 1 of 1 seed" in text and "flags" not in text
    assert collapse_lab.RULE in text


def test_the_verdict_view_keeps_both_flags_in_a_notebooks_width():
    table = collapse_lab.verdict(xr.load_dataset(collapse_lab.MEASURED))
    view = collapse_lab.view(table)
    assert {"reward collapsed", "grad spike > 10x"} <= set(view.columns)
    assert max(len(line) for line in view.to_string().splitlines()) <= 120  # a notebook's width, no scrollbar


def test_the_figure_draws_each_run_and_marks_the_collapsed_one():
    fig = collapse_lab.figure(xr.load_dataset(collapse_lab.MEASURED))
    reward = fig.axes[0]
    labels = [line.get_label() for line in reward.get_lines()]
    assert labels == ["none seed 0", "none seed 1: reward collapsed", "tis seed 0", "icepop seed 0", "icepop seed 1"]
    assert reward.get_lines()[1].get_linewidth() > reward.get_lines()[0].get_linewidth()
    assert [t.get_text() for t in fig.axes[1].texts] == ["icepop seed 0: 14x its median, unsmoothed"]


def test_a_verdict_over_unfinished_runs_says_so():
    rising = np.minimum(np.arange(200) / 100, 1.0) * 0.6
    ds = _curves(none=(rising, np.ones(200)), tis=(rising, np.ones(200)), icepop=(rising, np.ones(200)))
    ds["reward"][dict(arm=1, step=slice(120, None))] = np.nan  # tis stopped after 120 steps
    ds.attrs["steps"] = 200
    table = collapse_lab.verdict(ds)
    assert table["steps"].tolist() == [200, 120, 200] and table["steps_planned"].tolist() == [200] * 3
    text = collapse_lab.sentence(table)
    assert text.startswith("So far, with unfinished runs: By reward, no run collapses")
    assert "unfinished: 120 of 200 steps" in text and text.count("unfinished:") == 1
    ds["reward"][dict(arm=1)] = rising
    assert "unfinished" not in collapse_lab.sentence(collapse_lab.verdict(ds))


def test_smoothed_is_a_trailing_mean_of_the_finite_values():
    v = np.array([1.0, np.nan, 3.0, 5.0, np.nan, np.nan, np.nan])
    np.testing.assert_allclose(smoothed(v, 2), [1.0, 1.0, 3.0, 4.0, 5.0, np.nan, np.nan])
    np.testing.assert_array_equal(smoothed(v, 1), v)
    with pytest.raises(ValueError, match="smooth=0"):
        smoothed(v, 0)


def test_full_size_is_the_issues_setup():
    cfg = TrainConfig.from_yaml(collapse_lab.CONFIG)
    assert cfg.trainer_dtype == "bfloat16" and "weights=int4" in cfg.engine and cfg.steps >= 200
    assert cfg.monitor_every == 20 and cfg.max_new_tokens >= 32
    assert len(collapse_lab.SEEDS["none"]) >= 2 and len(collapse_lab.SEEDS["icepop"]) >= 2


def test_full_size_draws_each_arms_step_bar_and_small_draws_none(monkeypatch):
    """The entry runs inside the runner's quiet block; at full size each arm's bar is its only sign of life."""
    from labs import zoo

    monkeypatch.setattr(zoo, "build", lambda name: f"/models/{name}")
    assert collapse_lab.config().progress and not collapse_lab.config(small=True).progress


def test_collapse_entry_runs_small(tmp_path):
    assert reproduce.main(["--small", "--only", "collapse", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "collapse" / "summary.json").read_text())
    assert "Rule: collapsed:" in summary["ours"] and (tmp_path / "collapse" / "collapse.png").stat().st_size > 0
    for arm in collapse_lab.ARMS:
        assert summary["numbers"][f"collapsed {arm} seed0"] in (0.0, 1.0)
        assert summary["numbers"][f"steps {arm} seed0"] == collapse_lab.SMALL["steps"]
    ds = xr.open_dataset(tmp_path / "collapse" / "collapse.nc")
    assert list(ds["arm"].values) == list(collapse_lab.ARMS)
    for var in ("grad_norm_max", "icepop_band_out", "abs_dprob_mean", "abs_dprob_max"):
        assert np.isfinite(ds[var].values).all(), var  # every arm logs them, whatever its correction
    assert pd.Series(ds["frac_masked"].sel(arm="none").values.ravel()).eq(0).all()


def test_a_killed_entry_continues_each_arm_from_its_checkpoint(tmp_path, monkeypatch):
    """The full entry takes hours: a second call on the same folder resumes every arm (here: the
    first call stopped after 1 step, the second continues to 2), it does not start them again."""
    from minirl.training import run_log

    monkeypatch.setitem(collapse_lab.SMALL, "steps", 1)
    first, _ = collapse_lab.train_arms(small=True, out_dir=str(tmp_path))
    assert first.sizes["step"] == 1
    _reads_an_unfinished_entry_without_training(tmp_path, first)
    monkeypatch.setitem(collapse_lab.SMALL, "steps", 2)
    ds, logs = collapse_lab.train_arms(small=True, out_dir=str(tmp_path))
    assert ds.sizes["step"] == 2 and np.isfinite(ds["reward"].values).all()
    for arm in collapse_lab.ARMS:
        notes = [e["event"] for e in run_log.events(logs[f"{arm}_seed0"])]
        assert any("steps changed on resume at step 1: 1 -> 2" in n for n in notes), notes
        step0 = dict(arm=arm, step=0)
        np.testing.assert_array_equal(ds["reward"].sel(step0).values, first["reward"].sel(step0).values)


def _reads_an_unfinished_entry_without_training(root, trained):
    """``read_arms``: an entry with one arm of three looked at mid-way, nothing resumed."""
    import shutil

    partial = root / "partial"
    shutil.copytree(root / "none_seed0", partial / "none_seed0")
    before = sorted(p.name for p in (partial / "none_seed0").iterdir())
    ds, logs = collapse_lab.read_arms(partial)
    assert list(logs) == ["none_seed0"] and sorted(p.name for p in (partial / "none_seed0").iterdir()) == before
    np.testing.assert_array_equal(ds["reward"].sel(arm="none").values, trained["reward"].sel(arm="none").values)
    assert np.isnan(ds["reward"].sel(arm=["tis", "icepop"]).values).all()
    assert collapse_lab.verdict(ds).index.tolist() == [("none", 0)]
    assert ds.attrs["model"] == "tiny-qwen3-moe-seed0" and ds.attrs["steps"] == 1
    with pytest.raises(FileNotFoundError, match="no collapse run under .*labs.reproduce --only collapse"):
        collapse_lab.read_arms(root / "nothing")
