"""Hostile inputs, round 5 (issue 65), the collapse entry: ``read_arms`` of a folder where an arm has
not started yet (at full size the state for hours) reads the runs that are there, NaN for the rest,
and the verdict and its sentence say which runs are missing; an entry killed between arms, or by
kill -9 inside an arm, continues each run from its checkpoint, each step once, and leaves a finished
arm's files untouched. Named by the round-5 case id (CL)."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from labs import collapse_lab
from minirl.training.run_log import RunLog
from minirl.training.train_config import TrainConfig

REPO = Path(__file__).resolve().parents[2]


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


ENTRY = """
import sys
from labs import collapse_lab
collapse_lab.SMALL = dict(collapse_lab.SMALL, steps=8, checkpoint_every=2, prompts_per_step=1, group_size=2,
                          max_new_tokens=3)
collapse_lab.train_arms(small=True, out_dir=sys.argv[1])
"""
"""The collapse entry, small, at 8 steps checkpointed every 2 (CL11's "step 2 of 8"), as its own process; one
prompt of two rollouts a step (a step's cost is mostly its log write and update, not its size)."""


def _entry(root: Path, err) -> subprocess.Popen:  # noqa: ANN001 - a file its stderr goes to (a pipe may fill)
    return subprocess.Popen([sys.executable, "-c", ENTRY, str(root)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)


def _files(run: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``run`` -> (size, mtime_ns, sha256): what "untouched" compares."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns,
                                      hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(run.rglob("*")) if p.is_file()}


# the small entry twice, 24 steps in all: 58 s of CPU measured (most of it imports, per-step log writes and
# plots), 2.5-4.5 min of wall time on a loaded 2-core box
@pytest.mark.slow
def test_CL11_CL12_an_entry_killed_after_tis_first_checkpoint_continues_tis_and_leaves_none_untouched(tmp_path,
                                                                                                      zoo_root):
    """CL11: kill -9 of the entry right after tis's first checkpoint (step 2 of 8), watched for on
    disk; CL12: the entry again continues tis from step 2 to 8, each step logged once (steps 0-1
    the rows the checkpoint kept, their timings included, so not retrained), and leaves the finished
    none arm's files as they were (bytes and mtimes), icepop trained."""
    from minirl.training import checkpointing, run_log

    root, err = tmp_path / "collapse", tmp_path / "entry.err"
    tis, none = root / "tis_seed0", root / "none_seed0"
    with err.open("w") as f:
        entry = _entry(root, f)
    deadline = time.monotonic() + 600
    try:
        while not (tis / "checkpoint" / "state.json").exists():  # swapped in whole: its presence is the save
            assert entry.poll() is None, (f"the entry ended (rc {entry.returncode}) before tis's first checkpoint:\n"
                                          f"{err.read_text()[-3000:]}")
            assert time.monotonic() < deadline, "no tis checkpoint within 600 s"
            time.sleep(0.01)
        entry.send_signal(signal.SIGKILL)
    finally:
        entry.kill()
        entry.wait(60)
    assert entry.returncode == -signal.SIGKILL
    kept = checkpointing.read_state(tis / "checkpoint")
    assert kept["step"] == 2, f"killed at tis's checkpoint of step {kept['step']}, not its first (2)"
    assert [r["step"] for r in kept["rows"]] == [0, 1]
    assert not (root / "icepop_seed0").exists()
    before = _files(none)
    assert run_log.load(none / "metrics.nc")["step"].values.tolist() == list(range(8))

    again = subprocess.run([sys.executable, "-c", ENTRY, str(root)], cwd=REPO, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _files(none) == before  # CL12: none untouched
    log = run_log.load(tis / "metrics.nc")
    assert log["step"].values.tolist() == list(range(8))  # CL12: each step once, up to 8
    for row in kept["rows"]:  # steps 0-1 as the checkpoint kept them: continued from step 2, not retrained
        for key, value in row.items():
            if isinstance(value, float):
                np.testing.assert_equal(float(log[key].values[row["step"]]), value, err_msg=key)
    assert checkpointing.read_state(tis / "checkpoint")["step"] == 8
    ds, _ = collapse_lab.read_arms(root)
    assert ds.attrs["missing"] == "" and np.isfinite(ds["reward"].values).all()
