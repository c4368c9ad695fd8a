"""``rollout: c3po``: C3PO++ (Ring-1T §2.3.3, Algorithm 1) as the trainer's rollout source, so
the reward can be compared with the synchronous loop at equal steps (Ring-1T Fig. 8).

    >>> minirl.train({**config, "rollout": "c3po", "c3po_token_budget": 400})

Iteration t (one ``Trainer.train_step``): ``C3poScheduler.step`` generates under θ_t until Φ
completed tokens; the finished groups are trained on (``Trainer.learn``: old logprobs under θ_t,
the configured correction against each token's own rollout logprob, minibatch updates); the
engine loads θ_{t+1}; the unfinished rollouts resume under it next iteration. Each rollout is scored the
moment it ends, on a thread, while the others still generate (reward overlap, CompassMax §3.2.2).

GRPO needs whole groups, which Algorithm 1 does not mention. The rule here: every problem enters
the pool as ``group_size`` rollouts; a finished rollout waits until its whole group has finished,
and the group is trained in the iteration that completes it; when any member is purged
(retention > σ) the group can never complete, so its other members are dropped too (counted in
``c3po_dropped_tokens``). Members of one group may finish under different policy versions: each
token keeps the logprob of the version that sampled it, and the correction (IcePop by default)
is what makes that off-policy data usable, as in Ring-1T. A resumed run starts with an empty
pool: the partial rollouts in flight at the checkpoint are not saved.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from minirl.algorithms.c3po import C3poConfig, C3poScheduler, PoolRollout
from minirl.algorithms.reward_overlap import RewardOverlap
from minirl.engine.rollout import Rollout
from minirl.engine.sampling import SamplingParams
from minirl.tasks.base import Problem
from minirl.training.groups import Drawn, RolloutInputs
from minirl.training.train_config import TrainConfig


class GroupedPrompts:
    """The pool's prompt source: the run's problem stream, each problem ``group_size`` times
    in a row. The scheduler numbers rollouts in the order it asks for prompts, so ``group[uid]``
    is the group of rollout ``uid``."""

    def __init__(self, config: TrainConfig, inputs: RolloutInputs) -> None:
        self.cfg, self.inputs = config, inputs
        self.problems: list[Problem] = []  # group index -> problem
        self.group: list[int] = []  # rollout uid -> group index
        self._prompt: list[int] = []

    def __call__(self) -> list[int]:
        g = self.cfg.group_size
        if len(self.group) % g == 0:  # the previous group is complete: start a new one
            k = self.cfg.prompts_per_step
            step, i = divmod(len(self.problems), k)
            self.problems.append(self.inputs.problems(step)[i])
            self._prompt = self.inputs.prompt(self.problems[-1])
        self.group.append(len(self.problems) - 1)
        return list(self._prompt)


class C3poGroups:
    """``collect(step)`` for ``rollout: c3po``: one Algorithm 1 iteration, then the groups it
    completed. Keeps the pool, the waiting group members and their rewards across steps."""

    def __init__(self, config: TrainConfig, inputs: RolloutInputs) -> None:
        c = config
        self.cfg, self.inputs = c, inputs
        self.prompts = GroupedPrompts(c, inputs)
        cfg = C3poConfig(token_budget=c.c3po_token_budget, pool_capacity=c.c3po_pool_capacity or
                         c.prompts_per_step * c.group_size, max_new_tokens=c.max_new_tokens,
                         retention=c.c3po_retention, chunk_tokens=c.c3po_chunk_tokens)
        self.scheduler = C3poScheduler(inputs.engine, self.prompts, cfg,
                                       SamplingParams(temperature=c.temperature, seed=c.seed), on_finish=self._score)
        self.waiting: dict[int, list[PoolRollout]] = defaultdict(list)
        self.rewards: dict[int, tuple[float, bool]] = {}  # uid -> (reward, verifier raised), until trained
        self.dead: set[int] = set()  # groups that lost a member to the retention limit
        self.trained: list[list[PoolRollout]] = []  # per iteration
        self._overlap: RewardOverlap | None = None

    def _score(self, o: PoolRollout) -> None:
        """Scoring starts the moment a rollout ends, while the others generate (CompassMax §3.2.2)."""
        self._overlap.submit(o.uid, self.prompts.problems[self.prompts.group[o.uid]], list(o.token_ids))

    def collect(self, step: int, seed: int) -> Drawn:
        """One iteration under the engine's current weights (the sampling seed is the run's, per
        engine call: ``seed`` is unused, a rollout spans iterations)."""
        c, prompts = self.cfg, self.prompts
        with RewardOverlap(self.inputs.score, workers=2) as overlap:
            self._overlap = overlap
            batch = self.scheduler.step()
            self.rewards.update(overlap.gather())
        self.dead |= {prompts.group[o.uid] for o in batch.purged}
        for o in batch.rollouts:
            self.waiting[prompts.group[o.uid]].append(o)
        self.scheduler.pool = [o for o in self.scheduler.pool if prompts.group[o.uid] not in self.dead]
        lost = [o for g in self.dead & self.waiting.keys() for o in self.waiting.pop(g)]
        for o in lost:  # their rewards are never used
            del self.rewards[o.uid]
        ready = sorted(g for g, members in self.waiting.items() if len(members) == c.group_size)
        groups = [sorted(self.waiting.pop(g), key=lambda o: o.uid) for g in ready]
        self.trained.append([o for members in groups for o in members])
        scored = [self.rewards.pop(o.uid) for o in self.trained[-1]]
        lags = [batch.version - v for o in self.trained[-1] for v in o.versions]
        m = batch.metrics
        metrics = {"c3po_completed_tokens": float(m["c3po/completed_tokens"]),
                   "c3po_generated_tokens": float(m["c3po/generated_tokens"]), "c3po_purged": float(m["c3po/purged"]),
                   "c3po_dropped_tokens": float(sum(len(o.token_ids) for o in lost)),
                   "c3po_trained_groups": float(len(groups)),
                   "c3po_waiting_rollouts": float(sum(len(v) for v in self.waiting.values())),
                   "trained_tokens": float(len(lags)), "version_lag_mean": sum(lags) / len(lags) if lags else math.nan}
        rollouts = [Rollout(prompt_ids=o.prompt_ids, token_ids=o.token_ids,
                            logprobs=torch.tensor(o.logprobs, dtype=torch.float32), finish_reason=o.finish_reason)
                    for o in self.trained[-1]]
        return Drawn(rollouts, torch.tensor([r for r, _ in scored]), c.group_size, sum(e for _, e in scored), metrics)
