"""``aligntools.monitor``: routing flips from stats-mode ``topk_ids`` count set changes, not order
changes, and the monitor's capture target is the engine that generated the rollouts."""

from __future__ import annotations

import itertools

import pytest
import torch
import xarray as xr

from aligntools.monitor import capture_target, routing_flips
from aligntools.tracker.stats import STAT_NAMES, row_stats


def stats(layer: int, ids: list[list[int]]) -> xr.Dataset:
    return xr.Dataset({f"L{layer}.topk_ids": (("token", "stat"), row_stats(torch.tensor(ids)).numpy())},
                      coords={"stat": list(STAT_NAMES)})


def test_flips_count_changed_sets_not_reordered_ids():
    a = stats(2, [[1, 5], [2, 3], [7, 0], [4, 6]])
    b = stats(2, [[5, 1], [2, 4], [0, 7], [6, 4]])  # token 1 changed its set, the others only their order
    assert routing_flips(a, b) == {2: 0.25}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_other_set_of_up_to_four_experts_is_a_flip(k):
    """For k <= 4 distinct ids, min, max, sum and sum of squares pin the set: exhaustive over 8 experts."""
    sets = [list(c) for c in itertools.combinations(range(8), k)]
    for s in sets:
        a = stats(0, [s] * len(sets))
        b = stats(0, [list(reversed(t)) for t in sets])
        assert routing_flips(a, b)[0] == pytest.approx((len(sets) - 1) / len(sets))


def test_rows_are_paired_by_the_alignment():
    a, b = stats(0, [[1, 2], [3, 4]]), stats(0, [[3, 4], [2, 1]])
    assert routing_flips(a, b) == {0: 1.0}
    assert routing_flips(a, b, idx_a=None, idx_b=torch.tensor([1, 0]).numpy()) == {0: 0.0}


def test_an_engine_the_tracker_cannot_capture_is_named():
    class Plugin:
        def generate(self, prompts, params): ...

    with pytest.raises(TypeError, match="cannot capture a .*Plugin rollout engine: it captures minirl's Engine, "
                                        "vLLM and SGLang rollouts"):
        capture_target(Plugin())
