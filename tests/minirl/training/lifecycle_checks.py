"""The run lifecycle every mode shares, checked the same way for ``sync``, ``async`` and ``ray``
(``test_lifecycle.py`` runs the first two, ``tests/minirl/scale_out/test_ray_lifecycle.py`` the third,
on its one Ray cluster)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from minirl.training import run_dir, run_log
from minirl.driver import train
from minirl.training.train_config import TrainConfig


def lifecycle_config(model: str, out_dir: Path, mode: str, **changes) -> TrainConfig:
    """3 steps of 2 prompts x 4 samples, held-out evaluation every 2 steps, a checkpoint every step."""
    values = dict(model=model, mode=mode, sft_steps=0, prompts_per_step=2, group_size=4, max_new_tokens=4, steps=3,
                  minibatches=1, n_train=16, n_eval=2, eval_every=2, checkpoint_every=1, progress=False,
                  report_to="tensorboard", out_dir=str(out_dir), lr=1e-2, max_staleness=1, rollout_actors=1,
                  cpus_per_actor=0.5)
    return TrainConfig(**{**values, **changes})


def check_lifecycle(model: str, out_dir: Path, mode: str) -> None:
    """One short run: every artefact, the evaluation schedule, then each resume rule."""
    result = train(lifecycle_config(model, out_dir, mode))
    files = run_dir.read_manifest(out_dir)
    for name in ("config.yaml", "metrics.nc", "curves.png"):
        assert (out_dir / name).is_file() and name in files, name
    assert yaml.safe_load((out_dir / "config.yaml").read_text())["mode"] == mode
    assert json.loads((out_dir / "checkpoint" / "state.json").read_text())["step"] == 3
    events = [f for f in files if f.startswith("tensorboard/events.out.tfevents.")]
    assert events and all((out_dir / f).is_file() for f in events)

    log = run_log.load(out_dir / "metrics.nc")
    assert log["step"].values.tolist() == [0, 1, 2, 3]  # step 3: the final policy, evaluated after the last update
    accuracy = log["eval_accuracy"].values.tolist()
    assert [not math.isnan(a) for a in accuracy] == [True, False, True, True]  # before steps 0 and 2, at the end
    assert not math.isnan(log["eval_reward"].values[3]) and math.isnan(log["reward"].values[3])
    assert [r["step"] for r in result.rows] == [0, 1, 2, 3]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out_dir / "tensorboard"))
    board.Reload()
    assert [e.step for e in board.Scalars("eval_accuracy")] == [0, 2, 3]
    assert [e.value for e in board.Scalars("reward")] == pytest.approx(log["reward"].values[:3].tolist())

    with pytest.raises(ValueError, match=r"--resume would change seed \(seed: 0 -> 5\)"):
        train(lifecycle_config(model, out_dir, mode, steps=4, seed=5), resume=True)
    with pytest.raises(ValueError, match=r"--resume would change mode"):
        train(lifecycle_config(model, out_dir, "sync" if mode != "sync" else "async", steps=4), resume=True)
    resumed = train(lifecycle_config(model, out_dir, mode, steps=4, lr=5e-2), resume=True)
    log = run_log.load(out_dir / "metrics.nc")
    assert log["step"].values.tolist() == [0, 1, 2, 3, 4]
    assert log["lr"].values[:4].tolist() == [1e-2, 1e-2, 1e-2, 5e-2]  # the optimizer really trains at the new rate
    assert {"step": 3, "event": "lr changed on resume at step 3: 0.01 -> 0.05"} in run_log.events(log)
    assert [r["step"] for r in resumed.rows][:3] == [r["step"] for r in result.rows][:3]
    assert resumed.rows[0]["reward"] == result.rows[0]["reward"]  # the restored rows are the run's own
    assert json.loads((out_dir / "checkpoint" / "state.json").read_text())["step"] == 4
