"""Hostile inputs, round 5 (issue 65), the collapse entry: ``read_arms`` of a folder where an arm has
not started yet (at full size the state for hours) reads the runs that are there, NaN for the rest,
and the verdict and its sentence say which runs are missing. Named by the round-5 case id (CL)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from labs import collapse_lab
from minirl.training.run_log import RunLog
from minirl.training.train_config import TrainConfig


def _run(root: Path, name: str, steps: int, planned: int) -> None:
    """A run directory as ``minirl.train`` leaves it after ``steps`` of ``planned`` steps."""
    log = RunLog(root / name / "metrics.nc")
    for step in range(steps):
        log.append(step, {"reward": 0.5, "grad_norm_max": 1.0, "abs_dprob_max": 0.1})
    config = TrainConfig(model="/models/tiny", steps=planned).to_dict()
    (root / name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def test_CL03_an_arm_not_started_is_read_as_nan_and_named(tmp_path):
    """The full-size seeds: none (0, 1) and tis (0) ran, tis half-way; icepop (0, 1) not started."""
    for name, steps in (("none_seed0", 4), ("none_seed1", 4), ("tis_seed0", 2)):
        _run(tmp_path, name, steps, planned=4)
    ds, logs = collapse_lab.read_arms(tmp_path)
    assert sorted(logs) == ["none_seed0", "none_seed1", "tis_seed0"]
    assert list(ds["arm"].values) == list(collapse_lab.ARMS) and list(ds["seed"].values) == [0, 1]
    assert (ds["reward"].sel(arm="none").values == 0.5).all()
    np.testing.assert_array_equal(ds["reward"].sel(arm="tis", seed=0).values, [0.5, 0.5, np.nan, np.nan])
    assert np.isnan(ds["reward"].sel(arm="icepop").values).all()
    assert np.isnan(ds["reward"].sel(arm="tis", seed=1).values).all()  # tis runs one seed: not missing
    assert ds.attrs["missing"] == "icepop_seed0, icepop_seed1"
    table = collapse_lab.verdict(ds)
    assert table.index.tolist() == [("none", 0), ("none", 1), ("tis", 0)]
    assert table.attrs["missing"] == ["icepop_seed0", "icepop_seed1"]
    text = collapse_lab.sentence(table)
    assert text.startswith("So far, with unfinished runs: ")
    assert "not started: icepop_seed0, icepop_seed1." in text and "unfinished: 2 of 4 steps" in text


def test_CL03_a_complete_entry_has_nothing_missing(tmp_path):
    for name in ("none_seed0", "tis_seed0", "icepop_seed0"):  # the small entry: seed 0 of each arm
        _run(tmp_path, name, 2, planned=2)
    ds, _ = collapse_lab.read_arms(tmp_path)
    assert ds.attrs["missing"] == "" and np.isfinite(ds["reward"].values).all()
    text = collapse_lab.sentence(collapse_lab.verdict(ds))
    assert "not started" not in text and not text.startswith("So far")


def _rows(logs: dict, name: str) -> list[tuple[int, float]]:
    """(step, reward) of a run's trained rows, in log order (a retrained or duplicated step shows)."""
    log = logs[name]
    return [(int(s), float(r)) for s, r in zip(log["step"].values, log["reward"].values) if np.isfinite(r)]


@pytest.mark.slow  # the small entry three times: ~4 min on a loaded 2-core box
def test_CL01_CL07_an_entry_killed_between_arms_continues_and_a_finished_one_retrains_nothing(tmp_path, monkeypatch):
    """CL01/CL02: the entry dies once none and tis are done (icepop's start raises, as a kill would
    leave it: not started): both logs complete, each step once. CL04/CL05: the entry again trains
    icepop and reads none and tis back unchanged. CL06/CL07: once more, nothing is retrained."""
    import minirl

    train = minirl.train

    def killed_at_icepop(cfg, resume=False):
        if cfg.correction == "icepop":
            raise KeyboardInterrupt("killed between arms")
        return train(cfg, resume=resume)

    monkeypatch.setattr(minirl, "train", killed_at_icepop)
    with pytest.raises(KeyboardInterrupt):
        collapse_lab.train_arms(small=True, out_dir=str(tmp_path))
    steps = list(range(collapse_lab.SMALL["steps"]))
    ds, logs = collapse_lab.read_arms(tmp_path)
    first = {name: _rows(logs, name) for name in ("none_seed0", "tis_seed0")}
    assert all([s for s, _ in rows] == steps for rows in first.values())
    assert ds.attrs["missing"] == "icepop_seed0"
    monkeypatch.setattr(minirl, "train", train)
    for _ in range(2):  # CL04/CL05, then CL06/CL07
        ds, logs = collapse_lab.train_arms(small=True, out_dir=str(tmp_path))
        assert {name: _rows(logs, name) for name in first} == first
        assert [s for s, _ in _rows(logs, "icepop_seed0")] == steps and ds.attrs["missing"] == ""
