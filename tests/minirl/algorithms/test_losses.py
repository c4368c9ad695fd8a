"""minirl.algorithms.losses and minirl.algorithms.advantages: hand-computed cases and float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algorithms import advantages, losses


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(losses.aggregate(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(losses.aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(losses.aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError, match="token-mean"):
        losses.aggregate(loss, mask, "mean")


def _ppo_reference(logp, old, adv, mask, el, eh, c):
    """float64 scalar loop, token-mean."""
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            r, a = math.exp(float(logp[i, t]) - float(old[i, t])), float(adv[i])
            pg = max(-a * r, -a * min(max(r, 1 - el), 1 + eh))
            if a < 0 and c is not None:
                pg = min(pg, -a * c)
            total, n = total + pg, n + 1
    return total / n


@pytest.mark.parametrize("dual", [3.0, None])
def test_ppo_matches_float64_reference(dual):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(5, 7, generator=g, dtype=torch.float64) * 1.5  # big ratios hit both clips
    adv = torch.randn(5, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=g) > 0.2).double()
    loss, m = losses.ppo_clip_loss(logp, old, adv, mask, 0.2, 0.28, dual)
    assert float(loss) == pytest.approx(_ppo_reference(logp, old, adv, mask, 0.2, 0.28, dual), rel=1e-10)
    assert m["clipfrac_low"] + m["clipfrac_high"] > 0
    assert (m["dual_clipfrac"] > 0) == (dual is not None)


def test_ppo_hand_case_clip_higher_and_dual_clip():
    old = torch.zeros(3, 1)
    logp = torch.log(torch.tensor([[1.5], [0.5], [10.0]]))
    adv = torch.tensor([1.0, 1.0, -1.0])
    mask = torch.ones(3, 1)
    loss, _ = losses.ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0,
                                   agg="seq-mean-token-sum")
    # A>0, r=1.5 -> clipped at 1.28; A>0, r=0.5 -> min(0.5, 0.8) = 0.5; A<0, r=10 -> dual clip: 3
    assert float(loss) == pytest.approx((-1.28 - 0.5 + 3.0) / 3, rel=1e-6)


def test_ppo_gradient_zero_when_clipped_and_weights_scale():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 1.0]])).requires_grad_(True)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    weights = torch.tensor([[1.0, 0.5]])
    loss, _ = losses.ppo_clip_loss(logp, old, adv, mask, weights=weights, agg="seq-mean-token-sum")
    loss.backward()
    assert logp.grad[0, 0] == 0  # clipped at 1 + eps_high
    assert float(logp.grad[0, 1]) == pytest.approx(-0.5)  # -A * r * w


def test_gspo_equals_token_ppo_when_ratios_shared():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    shift = torch.tensor([0.1, -0.2, 0.0002, 0.5], dtype=torch.float64)[:, None]
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]],
                        dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3], dtype=torch.float64)
    lp1 = (old + shift).clone().requires_grad_(True)
    lp2 = (old + shift).clone().requires_grad_(True)
    kw = dict(eps_low=0.2, eps_high=0.28, agg="seq-mean-token-mean")
    l1, _ = losses.gspo_loss(lp1, old, adv, mask, **kw)
    l2, _ = losses.ppo_clip_loss(lp2, old, adv, mask, dual_clip=None, **kw)
    assert float(l1.detach()) == pytest.approx(float(l2.detach()), rel=1e-12)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(lp1.grad, lp2.grad)


def test_gspo_sequence_ratio_float64():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    logp = old + torch.randn(3, 5, generator=g, dtype=torch.float64) * 1e-3
    adv = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    loss, _ = losses.gspo_loss(logp, old, adv, mask, 3e-4, 4e-4)
    want = 0.0
    for i in range(3):
        s = math.exp(sum(float(logp[i, t] - old[i, t]) for t in range(5)) / 5)
        a = float(adv[i])
        want += max(-a * s, -a * min(max(s, 1 - 3e-4), 1 + 4e-4)) / 3
    assert float(loss) == pytest.approx(want, rel=1e-10)


def test_kl_estimators():
    logp = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.float64)
    k1, _ = losses.kl_penalty(logp, ref, mask, "k1")
    k3, m = losses.kl_penalty(logp, ref, mask, "k3")
    assert float(k1) == pytest.approx(0.0, abs=1e-12)  # log 2 and -log 2
    assert float(k3) == pytest.approx(((0.5 - 1 + math.log(2)) + (2 - 1 - math.log(2))) / 2)
    assert m["kl_ref_k3"] == pytest.approx(float(k3))


def test_grpo_and_drgrpo_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    a = advantages.grpo_advantages(r, 4)
    std = math.sqrt(((0.75 ** 2) + 3 * 0.25 ** 2) / 3)
    torch.testing.assert_close(a[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6))
    torch.testing.assert_close(a[4:], torch.zeros(4))  # all-correct group: no signal
    dr = advantages.grpo_advantages(r, 4, normalize_std=False)  # Dr.GRPO: TrainConfig(advantage="drgrpo")
    torch.testing.assert_close(dr[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_advantages_bad_input():
    with pytest.raises(ValueError, match="group_size"):
        advantages.grpo_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="groups of 3"):
        advantages.grpo_advantages(torch.ones(4), 3)
    with pytest.raises(ValueError, match="dual_clip"):
        losses.ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), dual_clip=1.0)
