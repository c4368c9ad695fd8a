"""Zero-variance elimination (CompassMax §2.4.1): DAPO filter, monitor, advantage reshaping."""

from __future__ import annotations

import pytest
import torch

from minirl.algorithms.zero_variance import (ZeroVarianceMonitor, dynamic_filter, is_zero_variance,
                                  reshape_zero_variance_advantages)


def test_dynamic_filter_refills_and_caps() -> None:
    gen = torch.Generator().manual_seed(0)

    def sample_batch():  # 4 groups of 4 binary rewards, pass rate 0.15: mostly all-zero groups
        return [(torch.rand(4, generator=gen) < 0.15).float().tolist() for _ in range(4)]

    res = dynamic_filter(sample_batch, lambda g: g, target=3, max_batches=50)
    assert res.filled and len(res.groups) == 3 and res.n_batches > 1
    assert not any(is_zero_variance(g) for g in res.groups)
    assert all(0 <= r <= 1 for r in res.zero_variance_rates)
    capped = dynamic_filter(lambda: [[0.0] * 4] * 4, lambda g: g, target=3, max_batches=2)
    assert (capped.filled, capped.groups, capped.n_batches, capped.zero_variance_rates) == (False, [], 2, [1.0, 1.0])


def test_monitor_rate_and_adaptive_n() -> None:
    mon = ZeroVarianceMonitor(n=8, n_max=32)
    m = mon.update([[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1]])
    assert m["zero_variance_rate"] == 0.5 and m["group_size"] == 8 and mon.n == 16
    mon.update([[1, 1], [1, 1]])
    assert mon.n == 32
    mon.update([[1, 1]])
    assert mon.n == 32  # capped at n_max
    for _ in range(6):
        mon.update([[0, 1]])
    assert mon.n == 4 and len(mon.history) == 9
    with pytest.raises(ValueError):
        ZeroVarianceMonitor(n=2, n_min=4)


def test_reshaping_rule() -> None:
    adv = torch.zeros(2, 3)
    ent = torch.tensor([[0.5, 1.0, 2.0], [0.2, 0.4, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    pos = reshape_zero_variance_advantages(adv, torch.ones(2), ent, mask, alpha=0.1)
    torch.testing.assert_close(pos, torch.tensor([[0.05, 0.1, 0.2], [0.02, 0.04, 0.0]]))
    neg = reshape_zero_variance_advantages(adv, torch.zeros(2), ent, mask, alpha=0.1)
    torch.testing.assert_close(neg, torch.tensor([[-0.15, -0.1, 0.0], [-0.02, 0.0, 0.0]]))
    mixed = torch.randn(2, 3)
    assert reshape_zero_variance_advantages(mixed, torch.tensor([0.0, 1.0]), ent, mask) is mixed
