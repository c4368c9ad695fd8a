"""What every run mode of the producer-consumer driver shares (``async``, ``ray``; ``sync`` is
its lockstep case, ``max_staleness = 0``): the TransferQueue columns and consumers, how a step's
prompts are admitted and how the learner trains on the samples that arrived. Split from ``async_loop`` so the Ray backend (``ray_actors``) and the
in-process one build on the same pieces without importing each other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from minirl.engine.sampling import SamplingParams
from minirl.training.learner import Learner
from minirl.scale_out.reward_worker import Scores
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import TrainResult
from minirl.scale_out.timeline import Timeline
from minirl.scale_out.transfer_queue import QueueConfig, Sample, TransferQueue

COLUMNS = ("prompt", "rollouts", "reward")
CONSUMERS = ("rollout", "reward", "train")


def staleness(train: TrainConfig) -> int:
    """Most updates a trained token may lag: ``max_staleness``, but 0 in lockstep (``sync``)."""
    return 0 if train.mode == "sync" else train.max_staleness


@dataclass
class LoopResult(TrainResult):
    """``TrainResult`` plus what the producer-consumer driver measures."""

    timeline: Timeline | None = None
    queue_stats: dict = field(default_factory=dict)
    staleness_hist: dict[int, int] = field(default_factory=dict)
    """trained tokens per staleness value (updates between sampling and training)."""
    wall_s: float = 0.0
    samples_per_s: float = 0.0


def queue_config(train: TrainConfig) -> QueueConfig:
    return QueueConfig(COLUMNS, CONSUMERS, train.queue_capacity, train.sample_timeout_s)


def sampling(train: TrainConfig, step: int, group: int) -> SamplingParams:
    """One seed per (run, step, prompt): a group's samples do not depend on which worker draws
    them or what else it batches, so a regenerated group equals the lost one."""
    return SamplingParams(n=train.group_size, max_new_tokens=train.max_new_tokens, temperature=train.temperature,
                          seed=((train.seed * 1_000_003 + step) * 100_003 + group) % (2 ** 62))


def admit_prompts(queue: TransferQueue, learner_problems: list, step: int, train: TrainConfig) -> None:
    """Step ``step``'s prompts enter the queue as samples (column ``prompt``)."""
    ids = queue.admit(len(learner_problems), group=step)
    for g, (i, (problem, prompt_ids)) in enumerate(zip(ids, learner_problems)):
        queue.write(i, "prompt", (problem, prompt_ids, sampling(train, step, g)))


def assemble(samples: list[Sample]) -> tuple[list, torch.Tensor, list[torch.Tensor], dict[str, float]]:
    """Resolved samples -> prompt-major rollouts, rewards, per-token versions, reward counts."""
    samples = sorted(samples, key=lambda x: x.index)
    rollouts, rewards, versions = [], [], []
    counts = {"reward_errors": 0.0, "reward_timeouts": 0.0}
    for x in samples:
        group, version = x.data["rollouts"]
        scores: Scores = x.data["reward"]
        rollouts += group
        versions += [torch.full((len(r.token_ids),), version, dtype=torch.long) for r in group]
        rewards += scores.rewards
        counts["reward_errors"] += scores.errors
        counts["reward_timeouts"] += scores.timeouts
    return rollouts, torch.tensor(rewards), versions, counts


def learn_on(learner: Learner, step: int, samples: list[Sample], expected: int) -> tuple[dict, dict[int, int]]:
    """Train on what arrived for ``step`` (fewer groups than ``expected`` if some timed out)."""
    rollouts, rewards, versions, counts = assemble(samples)
    if not rollouts:
        raise RuntimeError(f"step {step}: no sample completed within sample_timeout_s; every rollout or reward "
                           f"worker is stuck or dead (see queue stats 'timed_out')")
    stale = Counter(int(v) for t in versions for v in (learner.version - t).tolist())
    metrics = learner.learn(step, rollouts, rewards, versions)
    return {**metrics, **counts, "groups_missing": float(expected - len(samples))}, dict(stale)
