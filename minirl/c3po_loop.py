"""C3PO++ with the trainer in the loop: Ring-1T §2.3.3 (Algorithm 1) driving real updates, so
the reward can be compared with the synchronous loop at equal steps (Ring-1T Fig. 8).

    >>> from minirl.c3po_loop import train_c3po
    >>> result = train_c3po(train_config, token_budget=400)

Iteration t: ``C3poScheduler.step`` generates under θ_t until Φ completed tokens; the finished
rollouts are scored and trained on (``Trainer.learn``: old logprobs under θ_t, the configured
correction against each token's own rollout logprob, minibatch updates); the engine loads
θ_{t+1}; the unfinished rollouts resume under it next iteration. Each rollout is scored the
moment it ends, on a thread, while the others still generate (reward overlap, CompassMax §3.2.2).

GRPO needs whole groups, which Algorithm 1 does not mention. The rule here: every problem enters
the pool as ``group_size`` rollouts; a finished rollout waits until its whole group has finished,
and the group is trained in the iteration that completes it; when any member is purged
(retention > σ) the group can never complete, so its other members are dropped too (counted in
``c3po_dropped_tokens``). Members of one group may finish under different policy versions: each
token keeps the logprob of the version that sampled it, and the correction (IcePop by default)
is what makes that off-policy data usable, as in Ring-1T.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minirl import Rollout, SamplingParams
from minirl.balancing import RewardOverlap
from minirl.c3po import C3poConfig, C3poScheduler, PoolRollout
from minirl.rollout_engine import RolloutEngine
from minirl.run_log import RunLog
from minirl.sft import encode
from minirl.tasks.base import Problem
from minirl.train_config import TrainConfig
from minirl.trainer import Trainer


@dataclass
class C3poTrainResult:
    log_path: Path
    rows: list[dict]  # one per iteration, also in ``log_path``
    trainer: Trainer  # model, engine and evaluate() after the last update
    trained: list[list[PoolRollout]]  # per iteration, the rollouts trained on (whole groups)
    prompts: "GroupedPrompts"  # uid -> group -> problem
    dropped_groups: set[int]  # groups that lost a member to the retention limit


class GroupedPrompts:
    """The pool's prompt source: the trainer's problem stream, each problem ``group_size`` times
    in a row. The scheduler numbers rollouts in the order it asks for prompts, so ``group[uid]``
    is the group of rollout ``uid``."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.problems: list[Problem] = []  # group index -> problem
        self.group: list[int] = []  # rollout uid -> group index
        self._prompt: list[int] = []

    def __call__(self) -> list[int]:
        g = self.trainer.cfg.group_size
        if len(self.group) % g == 0:  # the previous group is complete: start a new one
            k = self.trainer.cfg.prompts_per_step
            step, i = divmod(len(self.problems), k)
            self.problems.append(self.trainer.problems(step)[i])
            self._prompt = encode(self.trainer.tokenizer, self.problems[-1].prompt)[0]
        self.group.append(len(self.problems) - 1)
        return list(self._prompt)


def train_c3po(train: TrainConfig, token_budget: int, retention: int = 2, chunk_tokens: int = 8,
               pool_capacity: int | None = None, engine: RolloutEngine | None = None) -> C3poTrainResult:
    """``train.steps`` C3PO++ iterations with budget Φ = ``token_budget`` completed tokens, σ =
    ``retention``, pool Ω = ``pool_capacity`` rollouts (default one synchronous step's,
    ``prompts_per_step * group_size``). Logs ``<out_dir>/c3po_metrics.nc``."""
    if train.router_replay == "r3":
        raise ValueError("router_replay='r3' with C3PO++: a resumed rollout is re-prefilled chunk by chunk, so no "
                         "single rollout-engine routing covers it; use router_replay: r2 or none")
    trainer = Trainer(train, engine)
    c = train
    cfg = C3poConfig(token_budget=token_budget, pool_capacity=pool_capacity or c.prompts_per_step * c.group_size,
                     max_new_tokens=c.max_new_tokens, retention=retention, chunk_tokens=chunk_tokens)
    prompts = GroupedPrompts(trainer)
    with RewardOverlap(lambda problem, tokens: trainer.score(problem, tokens), workers=2) as scores:
        def score_now(o: PoolRollout) -> None:
            scores.submit(o.uid, prompts.problems[prompts.group[o.uid]], list(o.token_ids))

        sched = C3poScheduler(trainer.engine, prompts, cfg, SamplingParams(temperature=c.temperature, seed=c.seed),
                              on_finish=score_now)
        waiting: dict[int, list[PoolRollout]] = defaultdict(list)
        dead: set[int] = set()
        log = RunLog(Path(c.out_dir) / "c3po_metrics.nc")
        trained: list[list[PoolRollout]] = []
        for step in tqdm(range(c.steps), desc="minirl C3PO++", unit="iter", disable=not c.progress):
            batch = sched.step()
            dead |= {prompts.group[o.uid] for o in batch.purged}
            for o in batch.rollouts:
                waiting[prompts.group[o.uid]].append(o)
            sched.pool = [o for o in sched.pool if prompts.group[o.uid] not in dead]  # no work on a lost group
            lost = [o for g in dead & waiting.keys() for o in waiting.pop(g)]
            scores.take([o.uid for o in lost])  # their rewards are never used
            ready = sorted(g for g, members in waiting.items() if len(members) == c.group_size)
            groups = [sorted(waiting.pop(g), key=lambda o: o.uid) for g in ready]
            trained.append([o for members in groups for o in members])
            rewards = scores.take([o.uid for o in trained[-1]])
            metrics = _learn(trainer, step, groups, [rewards[o.uid] for o in trained[-1]], batch.version)
            m = batch.metrics
            log.append(step, {**metrics, "time_rollout": m["c3po/rollout_time_s"],
                              "c3po_completed_tokens": float(m["c3po/completed_tokens"]),
                              "c3po_generated_tokens": float(m["c3po/generated_tokens"]),
                              "c3po_purged": float(m["c3po/purged"]),
                              "c3po_dropped_tokens": float(sum(len(o.token_ids) for o in lost)),
                              "c3po_trained_groups": float(len(groups)),
                              "c3po_waiting_rollouts": float(sum(len(v) for v in waiting.values()))})
    return C3poTrainResult(log.path, log.rows, trainer, trained, prompts, dead)


def _learn(trainer: Trainer, step: int, groups: list[list[PoolRollout]], scored: list[tuple[float, bool]],
           version: int) -> dict[str, float]:
    """Train on the completed groups (``scored``: (reward, verifier raised) per rollout, in
    order), then sync the engine; no group -> no update."""
    if not groups:
        return {"reward": math.nan, "nan_skipped": 0.0, "trained_tokens": 0.0, "version_lag_mean": math.nan,
                "time_update": 0.0, "time_sync": 0.0}
    rollouts = [Rollout(prompt_ids=o.prompt_ids, token_ids=o.token_ids,
                        logprobs=torch.tensor(o.logprobs, dtype=torch.float32), finish_reason=o.finish_reason)
                for members in groups for o in members]
    rewards = torch.tensor([reward for reward, _ in scored])
    metrics = trainer.learn(step, rollouts, rewards)
    lags = [version - v for members in groups for o in members for v in o.versions]
    t = time.perf_counter()
    if not metrics["nan_skipped"]:
        trainer.engine.load_weights(trainer.model)
    return {**metrics, "reward_errors": float(sum(error for _, error in scored)), "trained_tokens": float(len(lags)),
            "version_lag_mean": sum(lags) / len(lags), "time_sync": time.perf_counter() - t}
