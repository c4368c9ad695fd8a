"""What every run mode shares (``sync``, ``async``, ``ray``): the loop config, the TransferQueue
columns and consumers, how a step's prompts are admitted and how the learner trains on the
samples that arrived. Split from ``async_loop`` so the Ray backend (``ray_actors``) and the
in-process one build on the same pieces without importing each other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from minirl import SamplingParams
from minirl.learner import Learner
from minirl.reward_worker import Scores
from minirl.train_config import TrainConfig
from minirl.timeline import Timeline
from minirl.transfer_queue import QueueConfig, Sample, TransferQueue

MODES = ("sync", "async", "ray")
DISPATCH = ("fifo", "longest_first")
COLUMNS = ("prompt", "rollouts", "reward")
CONSUMERS = ("rollout", "reward", "train")


@dataclass
class LoopConfig:
    """How the RL step is executed (what it computes is ``TrainConfig``)."""

    mode: str = "sync"
    """``sync`` (lockstep, in process), ``async`` (producer thread up to ``max_staleness`` steps
    ahead, §4.2.2) or ``ray`` (actors; lockstep with ``max_staleness=0``)."""
    max_staleness: int = 1
    """most updates a trained token may lag the learner (AsyncFlow §4.2.1: one step costs no
    convergence); ignored by ``sync`` (always 0)."""
    reward_timeout_s: float = 30.0
    """a verifier call slower than this gives reward 0 and is counted (``reward_timeouts``)."""
    sample_timeout_s: float = 600.0
    """a sample not complete this long after admission is dropped and reported (§3.3)."""
    queue_capacity: int = 1024
    """samples (prompt groups) in flight at once: backpressure on the producer."""
    ray_address: str | None = None
    """``None`` starts a local cluster (``ray_num_cpus``); else ``host:port`` of a running one."""
    ray_num_cpus: int = 2
    rollout_actors: int = 1
    cpus_per_actor: float = 1.0
    """CPUs reserved by each rollout actor and the trainer actor (reward/queue actors take 0).
    More than the cluster has is an error at start, not a queue that never runs."""
    connect_timeout_s: float = 20.0
    """how long to wait for ``ray_address`` to answer before failing."""
    dispatch: str = "fifo"
    """order in which a step's prompts go to idle rollout actors (``ray``): ``fifo``, or
    ``longest_first``: predict each prompt's length from a short draft by the current policy and
    hand out the longest first, so no actor is left with a long rollout at the end (CompassMax
    §3.1.1; greedy longest-first is LPT, within 4/3 of the best makespan). Training order and
    results do not change, only which actor generates what, and when."""
    draft_tokens: int = 16
    """tokens of the ``longest_first`` draft; a draft that does not end predicts ``max_new_tokens``."""
    setup_modules: tuple[str, ...] = ()
    """modules every Ray worker imports first (e.g. one that ``tasks.register``s a task)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}; valid: {', '.join(MODES)}")
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"max_staleness={self.max_staleness!r}: must be an int >= 0 (0 = synchronous, "
                             f"1 = AsyncFlow's one-step-off delayed update)")
        if self.dispatch not in DISPATCH:
            raise ValueError(f"dispatch={self.dispatch!r}; valid: {', '.join(DISPATCH)}")
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens={self.draft_tokens}: need >= 1")
        if self.rollout_actors < 1:
            raise ValueError(f"rollout_actors={self.rollout_actors}: need at least one rollout worker")
        self.setup_modules = tuple(self.setup_modules)

    @property
    def staleness(self) -> int:
        return 0 if self.mode == "sync" else self.max_staleness


@dataclass
class LoopResult:
    rows: list[dict]
    """per-step metrics: the learner's, plus time_step, samples_per_s, time_sync, queue depth."""
    timeline: Timeline
    queue_stats: dict
    staleness_hist: dict[int, int] = field(default_factory=dict)
    """trained tokens per staleness value (updates between sampling and training)."""
    wall_s: float = 0.0
    samples_per_s: float = 0.0


def queue_config(loop: LoopConfig) -> QueueConfig:
    return QueueConfig(COLUMNS, CONSUMERS, loop.queue_capacity, loop.sample_timeout_s)


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
