"""C3PO++ with the trainer in the loop (``minirl.training.c3po_loop``): whole GRPO groups, each rollout
trained once, nothing older than σ, lost groups dropped, a real update per iteration."""

from __future__ import annotations

import math
from collections import Counter

import random

import pytest
import torch

from minirl import Rollout, SamplingParams
from minirl.driver import train_c3po


class GeometricEngine:
    """``generate`` + ``load_weights``: each token ends the rollout with chance 0.25 (seeded), so
    lengths have a long tail and rollouts of one group finish in different iterations."""

    def __init__(self) -> None:
        self.rng, self.syncs = random.Random(0), 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        out = []
        for p in prompts:
            n, stop = 0, False
            while n < params.max_new_tokens and not stop:
                n, stop = n + 1, self.rng.random() < 0.25
            out.append(Rollout(list(p), [5] * n, torch.full((n,), -1.0), "stop" if stop else "length"))
        return out

    def load_weights(self, model: torch.nn.Module) -> None:
        self.syncs += 1


def test_trains_whole_groups_once_within_retention(quick_config):
    sigma, engine = 1, GeometricEngine()
    cfg = quick_config(prompts_per_step=2, group_size=3, max_new_tokens=12, steps=8)
    result = train_c3po(cfg, token_budget=4, retention=sigma, chunk_tokens=1, engine=engine)
    assert len(result.rows) == 8 and result.log_path.exists()
    seen = Counter()
    for it, rollouts in enumerate(result.trained):
        groups = Counter(result.prompts.group[o.uid] for o in rollouts)
        assert all(n == cfg.group_size for n in groups.values()), groups  # GRPO needs the whole group
        assert not set(groups) & result.dropped_groups
        for o in rollouts:
            seen[o.uid] += 1
            assert o.prompt_ids == rollouts[0].prompt_ids or result.prompts.group[o.uid] != result.prompts.group[
                rollouts[0].uid]
            assert min(o.versions) >= it - sigma, f"a token sampled {it - min(o.versions)} versions ago"
            assert len(o.versions) == len(o.token_ids) == len(o.logprobs)
        row = result.rows[it]
        assert row["c3po_trained_groups"] == len(groups)
        assert math.isfinite(row["reward"]) == bool(rollouts)
    assert seen and max(seen.values()) == 1  # every rollout trained at most once
    assert sum(r["c3po_purged"] for r in result.rows) > 0  # σ = 1 and Φ = 1 token do purge
    assert result.dropped_groups
    assert engine.syncs == sum(1 for r in result.trained if r)  # a weight sync after every real update


def test_group_members_share_their_problem(quick_config):
    cfg = quick_config(prompts_per_step=2, group_size=4, steps=2)
    result = train_c3po(cfg, token_budget=16, chunk_tokens=4)
    for rollouts in result.trained:
        by_group: dict[int, set] = {}
        for o in rollouts:
            by_group.setdefault(result.prompts.group[o.uid], set()).add(tuple(o.prompt_ids))
        assert all(len(p) == 1 for p in by_group.values())
    assert any(r["time_update"] > 0 for r in result.rows)  # the trainer did update


def test_r3_is_refused(quick_config):
    with pytest.raises(ValueError, match="rollout: c3po with router_replay: r3 does not combine"):
        train_c3po(quick_config(router_replay="r3"), token_budget=16)
