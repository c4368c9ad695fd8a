"""C3PO++ rollout scheduler (Ring-1T §2.3.3, Algorithm 1): token-budget partitioned rollouts.

Why: in a synchronous step every GPU waits for the longest rollout. C3PO++ keeps an inference
pool P_infer of Ω_infer rollouts always full, stops generating as soon as the completed-token
count C reaches the budget Φ, trains on what finished (Q_train), and lets the unfinished rollouts
continue under the *updated* policy next iteration. Their earlier tokens keep the logprobs of the
policy version that sampled them (``versions`` records it per token), which is what an off-policy
correction needs. A rollout carried over more than σ partitions is purged (Algorithm 1 lines 5-6).

Algorithm 1, iteration t (``C3poScheduler.step``):
  purge rollouts whose retention > σ;  C <- 0
  while C < Φ:  refill P_infer to Ω_infer;  advance every rollout one chunk;
                each rollout that ended: C += |o|, move it to Q_train
  retention += 1 for every rollout left;  return Q_train (the caller updates θ_t -> θ_{t+1})

Engine protocol: any object with ``generate(prompts: list[list[int]], params) -> list[Rollout]``
(the minirl Engine, or a vLLM adapter). "Advance one chunk" is one such call with prompt =
original prompt + tokens so far and ``max_new_tokens = chunk``; Algorithm 1 advances one token
per step, so with chunks the budget check runs every ``chunk_tokens`` tokens and generation goes
past the moment C reaches Φ by at most one chunk per active rollout (chunk_tokens = 1 is exact).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minirl.engine.sampling import SamplingParams


@dataclass(frozen=True)
class C3poConfig:
    token_budget: int
    """Φ: completed tokens per iteration (Ring-1T §2.3.3). Must cover one chunk."""
    pool_capacity: int
    """Ω_infer: rollouts generated in parallel."""
    max_new_tokens: int
    """a rollout that reaches this many tokens is terminal (finish_reason "length")."""
    retention: int = 2
    """σ: partitions an unfinished rollout may be carried over before it is purged (>= 1)."""
    chunk_tokens: int = 16
    """tokens per engine call; smaller = closer to Algorithm 1's per-token check, more calls."""

    def __post_init__(self) -> None:
        if self.retention < 1:
            raise ValueError(f"retention σ={self.retention}: must be >= 1 (σ = 0 would drop every "
                             "unfinished rollout, which is C3PO without ++)")
        if self.chunk_tokens < 1 or self.max_new_tokens < 1 or self.pool_capacity < 1:
            raise ValueError("chunk_tokens, max_new_tokens and pool_capacity must be >= 1")
        if self.token_budget < self.chunk_tokens:
            raise ValueError(f"token budget Φ={self.token_budget} is smaller than one rollout chunk "
                             f"({self.chunk_tokens} tokens): raise token_budget or lower chunk_tokens")


@dataclass
class PoolRollout:
    """One rollout in P_infer or Q_train. ``versions[i]`` = policy version that sampled token i."""

    uid: int
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    retention: int = 0  # partitions survived (Ring-1T's "retention period")
    finish_reason: str | None = None


@dataclass
class C3poBatch:
    rollouts: list[PoolRollout]  # Q_train of this iteration
    purged: list[PoolRollout]  # dropped at this iteration's start (retention > σ)
    version: int  # the policy version θ_t that generated this iteration's tokens
    metrics: dict[str, Any]


class C3poScheduler:
    def __init__(self, engine: Any, sample_prompt: Callable[[], list[int]], cfg: C3poConfig,
                 params: SamplingParams | None = None,
                 on_finish: Callable[[PoolRollout], None] | None = None) -> None:
        """``sample_prompt()`` returns one prompt's token ids (refills the pool); ``params`` gives
        temperature / top-p / stop ids (its ``n`` and ``max_new_tokens`` are set per call);
        ``on_finish(rollout)`` runs the moment a rollout ends, mid-iteration (reward overlap,
        CompassMax §3.2.2: scoring starts while the others still generate)."""
        self.engine, self.sample_prompt, self.cfg, self.on_finish = engine, sample_prompt, cfg, on_finish
        self.params = params if params is not None else SamplingParams()
        self.pool: list[PoolRollout] = []
        self.version = 0
        self._uid = 0
        self._calls = 0

    def step(self) -> C3poBatch:
        """One iteration of Algorithm 1 under the engine's current weights (version ``self.version``)."""
        cfg, t0 = self.cfg, time.perf_counter()
        purged = [o for o in self.pool if o.retention > cfg.retention]
        self.pool = [o for o in self.pool if o.retention <= cfg.retention]
        done: list[PoolRollout] = []
        completed = generated = calls = before_last = 0
        last_step_tokens = active_at_last_step = 0
        while completed < cfg.token_budget:
            before_last = completed
            while len(self.pool) < cfg.pool_capacity:
                self.pool.append(PoolRollout(self._next_uid(), list(self.sample_prompt())))
            active_at_last_step = len(self.pool)
            last_step_tokens = self._advance(self.pool)
            generated, calls = generated + last_step_tokens, calls + 1
            for o in [o for o in self.pool if o.finish_reason is not None]:
                completed += len(o.token_ids)
                done.append(o)
                if self.on_finish is not None:
                    self.on_finish(o)
            self.pool = [o for o in self.pool if o.finish_reason is None]
        for o in self.pool:
            o.retention += 1
        counts = {"completed_tokens": completed, "completed_before_last_step": before_last,
                  "generated_tokens": generated, "engine_steps": calls,
                  "last_step_tokens": last_step_tokens, "last_step_active": active_at_last_step}
        batch = C3poBatch(done, purged, self.version, self._metrics(done, purged, counts, t0))
        self.version += 1
        return batch

    def _advance(self, rollouts: list[PoolRollout]) -> int:
        """Generate one chunk for every rollout (one engine call per distinct chunk length)."""
        by_len: dict[int, list[PoolRollout]] = {}
        for o in rollouts:
            by_len.setdefault(min(self.cfg.chunk_tokens, self.cfg.max_new_tokens - len(o.token_ids)), []).append(o)
        new = 0
        for n_tok, group in by_len.items():
            seed = None if self.params.seed is None else self.params.seed + self._calls
            params = dataclasses.replace(self.params, n=1, max_new_tokens=n_tok, seed=seed)
            self._calls += 1
            outs = self.engine.generate([o.prompt_ids + o.token_ids for o in group], params)
            for o, r in zip(group, outs):
                o.token_ids += list(r.token_ids)
                o.logprobs += torch.as_tensor(r.logprobs, dtype=torch.float32).tolist()
                o.versions += [self.version] * len(r.token_ids)
                new += len(r.token_ids)
                if r.finish_reason == "stop":
                    o.finish_reason = "stop"
                elif len(o.token_ids) >= self.cfg.max_new_tokens or len(r.token_ids) < n_tok:
                    o.finish_reason = "length"  # the cap, or the engine ran out of context
        return new

    def _next_uid(self) -> int:
        self._uid += 1
        return self._uid - 1

    def _metrics(self, done: list[PoolRollout], purged: list[PoolRollout], counts: dict[str, int],
                 t0: float) -> dict[str, Any]:
        tokens = Counter(v for o in done for v in o.versions)
        total = max(1, sum(tokens.values()))
        return {
            "c3po/rollout_time_s": time.perf_counter() - t0,
            **{f"c3po/{k}": v for k, v in counts.items()},
            "c3po/finished": len(done),
            "c3po/purged": len(purged),
            "c3po/purged_tokens": sum(len(o.token_ids) for o in purged),
            "c3po/carried_over": len(self.pool),
            "c3po/retention_hist": dict(sorted(Counter(o.retention for o in done).items())),
            "c3po/version_token_share": {v: n / total for v, n in sorted(tokens.items())},
        }
