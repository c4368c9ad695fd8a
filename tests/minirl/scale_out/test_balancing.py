"""Length-aware balancing (CompassMax §3.1.1)."""

from __future__ import annotations

import random

import pytest
import torch

from minirl import Rollout, SamplingParams
from minirl.scale_out.balancing import balance, makespan, predict_lengths


def test_balance_beats_round_robin_on_long_tail() -> None:
    rng = random.Random(0)
    lengths = [int(rng.paretovariate(1.2) * 50) for _ in range(64)]
    lpt = balance(lengths, 8)
    assert sorted(i for w in lpt for i in w) == list(range(64))
    round_robin = [list(range(w, 64, 8)) for w in range(8)]
    lower_bound = max(max(lengths), sum(lengths) / 8)
    assert makespan(lengths, lpt) <= makespan(lengths, round_robin)
    assert makespan(lengths, lpt) <= 4 / 3 * lower_bound + 1e-9
    assert balance([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]
    with pytest.raises(ValueError):
        balance([1], 0)


class DraftEngine:
    def generate(self, prompts, params):
        out = []
        for p in prompts:
            n = min(p[0], params.max_new_tokens)
            out.append(Rollout(p, [1] * n, torch.zeros(n), "stop" if n == p[0] else "length"))
        return out


def test_predict_lengths_from_drafts() -> None:
    got = predict_lengths(DraftEngine(), [[3], [50], [8]], SamplingParams(max_new_tokens=200), draft_tokens=10)
    assert got == [3, 200, 8]
