"""No compute for no signal: a minibatch whose advantages are all 0 (every group rewarded alike)
and that has no KL term runs no trainer forward, backward or optimizer step, and the step's
metrics say so; one informative group, or a KL term, brings the forward back."""

from __future__ import annotations

import pytest
import torch

from minirl.training import trainer as trainer_mod
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import Trainer, policy_loss
from minirl.training.trainer_forward import needs_forward


def _learn(quick_config, monkeypatch, rewards: list[float], drift: float = 0.0, **changes
           ) -> tuple[dict, list[bool], bool]:
    """One ``learn`` on a step's real rollouts with the given rewards -> (metrics, one flag per trainer
    forward: whether it built a graph (the update's; the old-logprob pass runs under no_grad), whether
    any weight moved). ``drift`` moves the policy off the initial (reference) weights first."""
    calls = []
    trainer = Trainer(quick_config(sft_steps=0, prompts_per_step=2, group_size=4, **changes))
    with torch.no_grad():
        for w in trainer.model.parameters():
            w.add_(drift * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    drawn = trainer.groups.collect(0, 0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    real = trainer_mod.forward

    def forward(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_mod, "forward", forward)
    metrics = trainer.learn(0, drawn.rollouts, torch.tensor(rewards))
    moved = any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    return metrics, calls, moved


EQUAL = [1.0] * 4 + [0.0] * 4  # two groups, each rewarded alike: every advantage is 0
ONE_INFORMATIVE = [1.0, 0.0, 0.0, 1.0] + [0.0] * 4


def test_equal_rewards_in_every_group_run_no_update_forward(quick_config, monkeypatch):
    m, calls, moved = _learn(quick_config, monkeypatch, EQUAL, minibatches=2)
    assert calls == [False]  # only the old-logprob pass (no_grad): no update forward, no backward
    assert m["skipped_minibatches"] == 2 and m["no_signal"] == 1.0 and m["opt_skipped"] == 1.0
    assert m["loss"] == 0.0 and m["grad_norm"] == 0.0 and not moved


def test_one_informative_group_trains_as_usual(quick_config, monkeypatch):
    m, calls, moved = _learn(quick_config, monkeypatch, ONE_INFORMATIVE, minibatches=1)
    assert calls == [False, True]  # old logprobs, then the update's forward
    assert m["skipped_minibatches"] == 0 and m["no_signal"] == 0.0 and m["opt_skipped"] == 0.0
    assert m["grad_norm"] > 0 and moved


def test_only_the_minibatches_without_signal_are_skipped(quick_config, monkeypatch):
    """Four minibatches of two rows: the ones holding a row of the informative group run."""
    m, calls, moved = _learn(quick_config, monkeypatch, ONE_INFORMATIVE, minibatches=4)
    ran = calls.count(True)
    assert 1 <= ran <= 4 and m["skipped_minibatches"] == 4 - ran and m["no_signal"] == 0.0
    assert m["opt_skipped"] == pytest.approx((4 - ran) / 4) and moved


def test_a_kl_term_keeps_the_forward(quick_config, monkeypatch):
    """With kl_coef > 0 the KL to the reference has a gradient even when every advantage is 0 (once
    the policy has left the reference: k3's gradient is 0 at pi = pi_ref)."""
    m, calls, _ = _learn(quick_config, monkeypatch, EQUAL, drift=0.01, minibatches=2, kl_coef=0.1)
    assert calls.count(True) == 2 and m["skipped_minibatches"] == 0 and m["no_signal"] == 0.0
    assert m["grad_norm"] > 0


@pytest.mark.parametrize("loss", ["ppo", "gspo", "espo"])
def test_every_policy_loss_has_zero_gradient_at_zero_advantages(loss):
    """What ``needs_forward`` relies on: no policy loss has a term that survives zero advantages."""
    cfg = TrainConfig(loss=loss, correction="none")
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 6, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(4, 6, generator=g)  # ratios far from 1: clipped and not
    mask = torch.ones(4, 6)
    loss_value, _ = policy_loss(cfg, logp, old, torch.zeros(4), mask, torch.ones(4, 6),
                                torch.rand(4, 6, generator=g) * 2, vocab_size=100)
    loss_value.backward()
    assert float(loss_value.detach()) == 0.0 and torch.count_nonzero(logp.grad) == 0
    assert not needs_forward(torch.zeros(4), 0.0) and needs_forward(torch.zeros(4), 0.1)
    assert needs_forward(torch.tensor([0.0, 0.5, 0.0, -0.5]), 0.0)
