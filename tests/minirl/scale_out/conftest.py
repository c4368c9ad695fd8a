"""Shared fixtures: one tiny RL config, the in-process sync run every mode is compared to, and a
module's local Ray cluster."""

from __future__ import annotations

import os

import pytest

from minirl.scale_out.async_loop import run
from minirl.training.train_config import TrainConfig


@pytest.fixture(scope="module")
def ray_cluster():
    """A local 2-CPU Ray cluster for one test module (its workers see this process's environment)."""
    import ray

    os.environ.setdefault("RAY_raylet_start_wait_time_s", "240")  # as minirl.scale_out.ray_actors.connect does
    for attempt in range(3):  # Ray gives its raylet a fixed 30 s to register: too short on a loaded host
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception:  # noqa: BLE001 - "The current node timed out during startup"
            ray.shutdown()
            if attempt == 2:
                raise
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def make_cfg(zoo, tmp_path_factory):
    """``make_cfg(**overrides) -> TrainConfig``: 2 prompts x 4 samples, 8 tokens, no SFT."""
    model = str(zoo("tiny-qwen3"))

    def make(**overrides) -> TrainConfig:
        values = dict(model=model, sft_steps=0, prompts_per_step=2, group_size=4, max_new_tokens=8, steps=2, minibatches=1,
                      n_train=16, n_eval=0, eval_every=0, checkpoint_every=0, progress=False,
                      out_dir=str(tmp_path_factory.mktemp("run")))
        return TrainConfig(**{**values, **overrides})

    return make


@pytest.fixture(scope="session")
def sync_rows(make_cfg):
    """Per-step metrics of the reference run: the driver in lockstep (``mode: sync``), 2 steps."""
    return run(make_cfg(mode="sync")).rows


def same_metrics(a: list[dict], b: list[dict]) -> None:
    """Every computed metric equal (timings, throughput and Ray restart counts excluded)."""
    skip = ("time_", "samples_per_s", "queue_in_flight", "actor_restarts")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        keys = {k for k in ra if not k.startswith(skip)}
        assert keys == {k for k in rb if not k.startswith(skip)}
        diff = {k: (ra[k], rb[k]) for k in keys if ra[k] != rb[k] and not (ra[k] != ra[k] and rb[k] != rb[k])}
        assert not diff, f"step {ra['step']}: {diff}"
