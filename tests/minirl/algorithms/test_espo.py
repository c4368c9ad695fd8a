"""ESPO (CompassMax §2.4.2) against float64 token-PPO and GSPO references written here.

Relationships tested (exact, value and gradient, float64, fixed clip ε):
* every token its own group (grouping="top_fraction" with ρ = 1, or "quantile" with K >= T) is
  token-level PPO with a per-sequence token mean (GRPO's sample-level aggregation);
* one group per sequence (ρ = 0, or K = 1) with one advantage per sequence is GSPO: the
  sequence's length-normalised ratio is clipped once and its gradient is s_i · mean_t ∇log π.
The issue's phrase "all tokens share one group -> token-level PPO" holds only in the sense that
each token is its own group; with all of a sequence's tokens in one group ESPO is GSPO.
"""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algorithms.espo import EspoConfig, entropy_groups, espo_loss

B, T, V, EPS = 4, 7, 50, 0.2


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * math.log(V)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False
    mask[3, 2:] = False
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, ent, mask, adv


def _token_ppo(logp, old, adv, mask):
    r = torch.exp(logp - old)
    a = adv[:, None]
    obj = torch.minimum(r * a, r.clamp(1 - EPS, 1 + EPS) * a) * mask
    return -(obj.sum(1) / mask.sum(1)).mean()


def _gspo(logp, old, adv, mask):
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    return -torch.minimum(s * adv, s.clamp(1 - EPS, 1 + EPS) * adv).mean()


def _grad(loss, logp):
    return torch.autograd.grad(loss, logp)[0]


@pytest.mark.parametrize("cfg, ref", [
    (EspoConfig(grouping="top_fraction", top_fraction=1.0, clip_eps=EPS), _token_ppo),
    (EspoConfig(grouping="quantile", n_groups=T, clip_eps=EPS), _token_ppo),
    (EspoConfig(grouping="top_fraction", top_fraction=0.0, clip_eps=EPS), _gspo),
    (EspoConfig(grouping="quantile", n_groups=1, clip_eps=EPS), _gspo),
])
def test_reduces_to_token_ppo_and_gspo(cfg, ref) -> None:
    for seed in range(3):
        logp, old, ent, mask, adv = _batch(seed)
        loss, _ = espo_loss(logp, old, adv, ent, mask, V, cfg)
        want = ref(logp, old, adv, mask)
        torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(_grad(loss, logp), _grad(want, logp), rtol=1e-12, atol=1e-12)


def test_eq1_as_printed_counts_the_token_ratio_twice() -> None:
    logp, old, ent, mask, adv = _batch()
    adv = adv.abs() * 0 + 1e-3  # tiny positive advantage: nothing clipped at eps=10
    cfg = EspoConfig(top_fraction=1.0, clip_eps=10.0, token_denominator="old")
    loss, _ = espo_loss(logp, old, adv, ent, mask, V, cfg)
    r2 = torch.exp(2 * (logp - old)) * mask * adv[:, None]
    torch.testing.assert_close(loss, -(r2.sum(1) / mask.sum(1)).mean())


def test_entropy_adaptive_clip_eq3() -> None:
    alpha, e = 0.3, 1.7
    logp = torch.zeros(1, 5, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 5), -0.5, dtype=torch.float64)  # s = e^0.5 > 1 + eps
    ent = torch.full((1, 5), e, dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    cfg = EspoConfig(top_fraction=0.0, alpha=alpha)
    loss, metrics = espo_loss(logp, old, torch.ones(1, dtype=torch.float64), ent, mask, V, cfg)
    eps = alpha * e / math.log(V)
    assert metrics["espo/eps_mean"] == pytest.approx(eps)
    assert float(loss.detach()) == pytest.approx(-(1 + eps)) and metrics["espo/clip_frac"] == 1.0
    assert float(_grad(loss, logp).abs().sum()) == 0.0


def test_grouping_rules() -> None:
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.8, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    top = entropy_groups(ent, mask, EspoConfig(top_fraction=0.4))  # ceil(0.4 * 5) = 2 singletons
    assert top[0, :5].tolist() == [0, 1, 0, 2, 0]
    q = entropy_groups(ent, mask, EspoConfig(grouping="quantile", n_groups=2))
    assert q[0, :5].tolist() == [1, 0, 0, 0, 1]  # ranks 0..4 -> rank * 2 // 5


def test_bad_input() -> None:
    logp, old, ent, mask, adv = _batch()
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        espo_loss(logp, old[:, :3], adv, ent, mask, V)
    with pytest.raises(ValueError, match="grouping"):
        EspoConfig(grouping="nope")
