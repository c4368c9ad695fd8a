"""In-process modes: ``async`` never trains on a token older than ``max_staleness``; reward
faults cost one reward; bad settings fail where they are written."""

from __future__ import annotations

import time

import pytest
import torch
from matplotlib.figure import Figure

from minirl import tasks
from minirl.scale_out.async_loop import LocalBackend, run
from minirl.scale_out.reward_worker import RewardWorker
from minirl.scale_out.timeline import staleness_figure
from minirl.training.train_config import TrainConfig


def test_async_stays_within_max_staleness(make_cfg, sync_rows):
    result = run(make_cfg(steps=3, mode="async", max_staleness=1))
    assert set(result.staleness_hist) == {0, 1}  # step 0 is fresh, later steps are one update old
    assert all(r["staleness_max"] <= 1 for r in result.rows)
    assert result.rows[0]["loss"] == sync_rows[0]["loss"]  # same weights for step 0
    assert isinstance(result.timeline.figure(result.queue_stats["depth"]), Figure)
    assert isinstance(staleness_figure({"async": result.staleness_hist}), Figure)
    assert {"rollout", "train", "sync", "reward"} <= set(result.timeline.busy_idle())


def test_learner_refuses_tokens_older_than_max_staleness(make_cfg):
    learner = LocalBackend(make_cfg(mode="async", max_staleness=1)).learner
    learner.version = 5
    with pytest.raises(RuntimeError, match="over max_staleness=1"):
        learner.learn(5, [], torch.zeros(0), [torch.tensor([3, 4])])


def test_max_staleness_must_be_a_nonnegative_int():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_staleness"):
            TrainConfig(mode="async", max_staleness=bad)
    with pytest.raises(ValueError, match="dispatch='lpt'; valid: fifo, longest_first"):
        TrainConfig(mode="ray", dispatch="lpt")
    with pytest.raises(ValueError, match="draft_tokens=0"):
        TrainConfig(mode="ray", dispatch="longest_first", draft_tokens=0)
    with pytest.raises(ValueError, match="mode="):
        TrainConfig(mode="fast")


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return {1: "ok", 2: "raise", 3: "hang"}[ids[0]]


class _Task:
    name = "faulty"

    def verify(self, problem, text):
        if text == "raise":
            raise ValueError("verifier bug")
        if text == "hang":
            time.sleep(30)
        return True


def test_a_reward_that_raises_or_hangs_scores_zero_and_is_counted():
    from minirl import Rollout

    rollouts = [Rollout([0], [t], torch.zeros(1), "stop") for t in (1, 2, 3)]
    start = time.monotonic()
    scores = RewardWorker(_Task(), _Tok(), timeout_s=0.5).score(tasks.Problem("q", "a"), rollouts)
    assert scores.rewards == [1.0, 0.0, 0.0] and scores.errors == 1 and scores.timeouts == 1
    assert time.monotonic() - start < 5
