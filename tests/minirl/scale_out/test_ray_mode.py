"""``ray`` mode on one module-scoped local cluster (2 CPUs): same numbers as ``sync``, a killed
rollout actor loses nothing and duplicates nothing, resume reproduces the run, the Ray queue
keeps its invariants, and bad cluster settings fail clearly and fast."""

from __future__ import annotations

import dataclasses
import time

import pytest

ray = pytest.importorskip("ray")

from minirl.scale_out.async_loop import run  # noqa: E402
from minirl.scale_out.ray_actors import check_cpus, probe  # noqa: E402
from minirl.scale_out.ray_queue import RayTransferQueue  # noqa: E402
from minirl.training.train_config import TrainConfig  # noqa: E402
from minirl.scale_out.transfer_queue import QueueConfig  # noqa: E402

from .conftest import same_metrics  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_cluster):
    yield


# 50-80 s on 2 cores (two Ray runs, an actor restart and a resume). The first run also dispatches
# longest first, and the resumed step runs on one rollout actor, so this is also the check that
# length-aware dispatch and one Ray actor compute what ``sync`` does (separate tests of those cost
# ~25-35 s more of actor start-up each in every `make test`).
def test_killed_rollout_actor_loses_nothing_then_resume_on_one_actor_reproduces_the_run(make_cfg, sync_rows):
    """Length-aware dispatch (CompassMax §3.1.1) over 2 rollout actors, one of them killed mid-step:
    drafts order the prompts longest first and every sample keeps its seed and index, so who
    generates a sample changes and what it generates does not; the killed actor's samples are
    dispatched again, every other sample once."""
    cfg = make_cfg(steps=1, checkpoint_every=1, mode="ray", max_staleness=0, rollout_actors=2, cpus_per_actor=0.5,
                   dispatch="longest_first", draft_tokens=4)
    killed, order = [], []

    def kill_first(actor, indices):
        order.extend(indices)
        if not killed:
            killed.extend(indices)
            ray.kill(actor)  # mid-step: it holds samples it will never return

    first = run(cfg, on_dispatch=kill_first)
    stats = first.queue_stats
    assert killed and stats["given_back"] == 1 and first.rows[0]["actor_restarts"] == 1
    assert stats["admitted"] == stats["retired"] == cfg.prompts_per_step and not stats["timed_out"]
    assert sorted(order) == sorted(list(range(cfg.prompts_per_step)) + killed)  # the lost ones twice, the rest once
    same_metrics(sync_rows[:1], first.rows)  # regenerated group == lost group: each sample once

    resumed = run(dataclasses.replace(cfg, steps=2, rollout_actors=1, cpus_per_actor=1.0), resume=True)
    same_metrics(sync_rows, resumed.rows)
    assert {"rollout0", "reward", "train", "sync"} <= set(resumed.timeline.busy_idle())


def test_ray_queue_writes_once_reads_once_and_hands_out_refs():
    q = RayTransferQueue(QueueConfig(("prompt", "out"), ("work", "train"), capacity=2, timeout_s=60))
    try:
        a, b = q.admit(2, group=0)
        for i in (a, b):
            q.write(i, "prompt", i)
        with pytest.raises(ray.exceptions.RayTaskError, match="written twice"):
            q.write(a, "prompt", 0)
        with pytest.raises(TimeoutError, match="queue full"):
            q.admit(1, group=0, timeout=0.2)
        work = q.get("work", ("prompt",), 2, group=0)
        assert all(isinstance(s.data["prompt"], ray.ObjectRef) for s in work)
        assert q.get("work", ("prompt",), 2) == []
        for s in work:
            q.write(s.index, "out", ray.get(s.data["prompt"]) * 10)
        got = {s.index: ray.get(s.data["out"]) for s in q.get("train", ("out",), 2, group=0)}
        assert got == {a: a * 10, b: b * 10} and q.stats()["in_flight"] == 0
    finally:
        q.close()


def test_an_address_that_does_not_answer_fails_within_30_s():
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="no Ray cluster answers.*ray start --head"):
        probe("127.0.0.1:1", timeout_s=20)  # nothing listening there
    with pytest.raises(ConnectionError, match="no Ray cluster answers"):
        probe("not-a-host-name.invalid:6379", timeout_s=20)
    assert time.monotonic() - start < 30


def test_more_actors_than_cpus_is_an_error_not_a_queue():
    with pytest.raises(ValueError, match="need 5 CPUs, the Ray cluster has 2"):
        check_cpus(TrainConfig(mode="ray", rollout_actors=4))
