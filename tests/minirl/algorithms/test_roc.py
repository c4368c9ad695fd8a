"""GRPO-RoC selection statistics on a synthetic group (rStar2-Agent §2.2.3)."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algorithms.roc import format_penalty, roc_select, tool_error_ratio


def test_penalty_equations() -> None:
    assert tool_error_ratio(0, 0) == 0.5  # Eq. 4 default with no tool calls
    assert tool_error_ratio(4, 1) == 0.25
    assert format_penalty(0, 3) == 1.0  # Eq. 5: no <answer> tag
    assert format_penalty(1, 3) == 0.0
    assert format_penalty(3, 4) == 0.5
    assert format_penalty(9, 2) == 1.0
    with pytest.raises(ValueError):
        tool_error_ratio(1, 2)


@pytest.mark.parametrize("n_pos", [0, 1, 5, 8, 16])
def test_sizes_and_split(n_pos: int) -> None:
    g = 8
    rewards = [1.0] * n_pos + [0.0] * (2 * g - n_pos)
    gen = torch.Generator().manual_seed(0)
    for mode in ("sample", "lowest"):
        idx = roc_select(rewards, [0.1] * (2 * g), g, generator=gen, mode=mode)
        assert len(idx) == g == len(set(idx))
        assert sum(rewards[i] > 0 for i in idx) == math.ceil(n_pos / 2)


def test_positives_with_lower_penalty_chosen_more_often_negatives_uniform() -> None:
    g = 8
    rewards = torch.tensor([1.0] * 8 + [0.0] * 8)
    penalties = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0] + [1.0] * 8)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(16)
    trials = 3000
    for _ in range(trials):
        counts[roc_select(rewards, penalties, g, generator=gen)] += 1
    pos = counts[:8]
    assert all(pos[i] >= pos[i + 1] for i in range(7)), pos  # monotone in penalty
    assert pos[0] > 0.9 * trials and pos[7] < 0.3 * trials
    neg = counts[8:] / trials  # each negative kept w.p. 4/8
    assert torch.allclose(neg, torch.full((8,), 0.5), atol=0.05), neg


def test_lowest_is_deterministic_and_seeded_sampling_repeats() -> None:
    rewards = [1, 1, 1, 1, 0, 0, 0, 0]
    penalties = [0.9, 0.1, 0.5, 0.1, 0, 0, 0, 0]
    idx = roc_select(rewards, penalties, 4, generator=torch.Generator().manual_seed(0), mode="lowest")
    assert [i for i in idx if i < 4] == [1, 3]
    a = roc_select(rewards, penalties, 4, generator=torch.Generator().manual_seed(7))
    b = roc_select(rewards, penalties, 4, generator=torch.Generator().manual_seed(7))
    assert a == b


def test_bad_group_size_names_the_fix() -> None:
    with pytest.raises(ValueError, match="oversample"):
        roc_select([1, 0, 1], [0, 0, 0], 2, generator=torch.Generator())
