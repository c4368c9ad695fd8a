"""C3PO++ (Ring-1T §2.3.3, Algorithm 1) invariants on a scripted engine, then the real one."""

from __future__ import annotations

import random

import pytest
import torch

from minirl import Engine, Rollout, SamplingParams
from minirl.algorithms.c3po import C3poConfig, C3poScheduler


class ScriptedEngine:
    """``generate`` protocol; a rollout's length is its prompt's first id. Token i of a rollout
    has logprob -(version + 1), so tests can see which policy version sampled it."""

    def __init__(self) -> None:
        self.version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        out = []
        for p in prompts:
            target, done = p[0], len(p) - 2  # prompts are [target, uid] + tokens so far
            n = min(params.max_new_tokens, target - done)
            out.append(Rollout(p, [7] * n, torch.full((n,), -(self.version + 1.0)),
                               "stop" if done + n == target else "length"))
        return out


def _long_tail_prompts(seed: int, max_len: int):
    rng, uid = random.Random(seed), iter(range(10 ** 9))
    return lambda: [min(max_len, 1 + int(rng.expovariate(1 / 12))), next(uid)]


@pytest.mark.parametrize("sigma, chunk", [(1, 4), (2, 8), (3, 1)])
def test_invariants(sigma: int, chunk: int) -> None:
    cfg = C3poConfig(token_budget=120, pool_capacity=12, max_new_tokens=80, retention=sigma, chunk_tokens=chunk)
    engine = ScriptedEngine()
    sched = C3poScheduler(engine, _long_tail_prompts(sigma, 200), cfg)
    seen: set[int] = set()
    for it in range(15):
        engine.version = it
        batch = sched.step()
        m = batch.metrics
        assert batch.version == it
        # budget: stop at the first engine step where C >= Φ; that step adds <= one chunk per rollout
        assert m["c3po/completed_before_last_step"] < cfg.token_budget <= m["c3po/completed_tokens"]
        assert m["c3po/last_step_tokens"] <= chunk * m["c3po/last_step_active"]
        assert sum(len(o.token_ids) for o in batch.rollouts) == m["c3po/completed_tokens"]
        for o in batch.rollouts:
            assert o.uid not in seen  # each finished rollout (and so each token) trained once
            seen.add(o.uid)
            assert len(o.token_ids) == min(o.prompt_ids[0], cfg.max_new_tokens)  # no token twice/lost
            assert o.retention <= sigma and len(set(o.versions)) <= sigma + 1
            assert o.versions == sorted(o.versions) and o.versions[-1] == it
            assert o.logprobs == [-(v + 1.0) for v in o.versions]  # prefix keeps its version's logprobs
        assert sum(m["c3po/version_token_share"].values()) == pytest.approx(1.0)
        assert all(o.retention <= sigma + 1 for o in sched.pool)
    assert any(len(set(o.versions)) > 1 for o in batch.rollouts) or sigma == 1


def test_purge_after_sigma_partitions() -> None:
    cfg = C3poConfig(token_budget=10, pool_capacity=2, max_new_tokens=1000, retention=1, chunk_tokens=5)
    prompts = iter([[1000, 0], [5, 1], [5, 2], [5, 3], [5, 4], [5, 5], [5, 6], [5, 7]])
    sched = C3poScheduler(ScriptedEngine(), lambda: next(prompts), cfg)
    m0, m1, m2 = (sched.step().metrics for _ in range(3))
    assert (m0["c3po/purged"], m1["c3po/purged"], m2["c3po/purged"]) == (0, 0, 1)
    assert m2["c3po/purged_tokens"] > 0


def test_on_finish_scores_each_rollout_once_before_the_iteration_ends() -> None:
    """Reward overlap: the callback fires as each rollout ends, mid-iteration, once per rollout."""
    cfg = C3poConfig(token_budget=40, pool_capacity=6, max_new_tokens=60, retention=3, chunk_tokens=4)
    engine, finished = ScriptedEngine(), []
    sched = C3poScheduler(engine, _long_tail_prompts(0, 60), cfg,
                          on_finish=lambda o: finished.append((o.uid, engine.calls_seen)))
    engine.calls_seen = 0
    original = engine.generate

    def counting(prompts, params):
        engine.calls_seen += 1
        return original(prompts, params)

    engine.generate = counting
    batch = sched.step()
    assert sorted(uid for uid, _ in finished) == sorted(o.uid for o in batch.rollouts)
    assert len({call for _, call in finished}) > 1  # scored across several engine calls, not at the end


def test_bad_config_names_the_fix() -> None:
    with pytest.raises(ValueError, match="smaller than one rollout chunk"):
        C3poConfig(token_budget=4, pool_capacity=2, max_new_tokens=8, chunk_tokens=8)
    with pytest.raises(ValueError, match="σ"):
        C3poConfig(token_budget=64, pool_capacity=2, max_new_tokens=8, retention=0)


def test_real_engine_end_to_end(zoo) -> None:
    engine = Engine.from_pretrained(zoo("tiny-qwen3"))
    rng = random.Random(0)
    cfg = C3poConfig(token_budget=48, pool_capacity=6, max_new_tokens=40, retention=2, chunk_tokens=8)
    sched = C3poScheduler(engine, lambda: [1] + [rng.randrange(3, 500) for _ in range(4)], cfg,
                          SamplingParams(temperature=1.0, seed=0))
    finished = 0
    for _ in range(3):
        batch = sched.step()  # a trainer would update engine weights here (load_weights)
        assert batch.metrics["c3po/completed_tokens"] >= cfg.token_budget
        for o in batch.rollouts:
            assert len(o.token_ids) == len(o.logprobs) == len(o.versions) <= cfg.max_new_tokens
            full = engine.score([o.prompt_ids + o.token_ids])[0][len(o.prompt_ids) - 1:]
            torch.testing.assert_close(torch.tensor(o.logprobs), full, atol=1e-4, rtol=1e-4)
        finished += len(batch.rollouts)
    assert finished > 0
