"""The RL labs at tiny size: each returns the data its notebook reads, with sane values."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure


@pytest.fixture(scope="module")
def pair(zoo):
    from labs import routing_lab

    zoo(routing_lab.MODEL)
    return routing_lab.load(tokens=48)


def test_routing_flips_are_near_ties(pair):
    from labs import routing_lab

    cmp = pair.compare()
    margins = routing_lab.flip_margins(pair, list(cmp.routing.index))
    assert len(margins) == 48 * len(cmp.routing) and (margins["margin"] >= 0).all()
    assert margins["flipped"].mean() == pytest.approx((cmp.routing["set_flip"]).mean())
    if margins["flipped"].any():  # a flipped token sits at a smaller margin than the typical one
        assert margins.loc[margins["flipped"], "margin"].median() < margins["margin"].median()
    assert isinstance(routing_lab.flip_figure(cmp.routing, margins), Figure)


def test_r3_shrinks_the_gap_and_r2_changes_nothing(pair):
    from labs import routing_lab

    res = routing_lab.replay_gap(pair.engine, pair.trainer, prompts=2, n=2, max_new_tokens=8)
    s = res.summary
    assert s.loc["R2", "mean"] == s.loc["no replay", "mean"]  # own routing replayed at equal weights
    assert 0 < s.loc["R3", "mean"] <= s.loc["no replay", "mean"] and res.reduction >= 1
    assert s.loc["R3", "max"] <= s.loc["no replay", "max"]
    assert isinstance(routing_lab.replay_figure(res), Figure)


def test_noisy_engine_perturbs_only_matrices():
    from labs.icepop_lab import NoisyEngine

    class Sink:
        def load_weights(self, sd):
            self.sd = sd

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    eng = NoisyEngine(Sink(), noise=0.1)
    eng.load_weights(model)
    w, b = model[0].weight.detach(), model[0].bias.detach()
    assert not torch.equal(eng.inner.sd["0.weight"], w) and torch.equal(eng.inner.sd["0.bias"], b)
    rel = float((eng.inner.sd["0.weight"] - w).std() / w.std())
    assert 0.03 < rel < 0.3


def test_icepop_arms_log_the_curves(zoo, tmp_path):
    from labs import icepop_lab

    zoo("tiny-qwen3-moe")
    ds = icepop_lab.train_arms(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, weight_noise=0.3,
                               out_dir=str(tmp_path), progress=False)
    assert list(ds["arm"].values) == list(icepop_lab.ARMS) and ds.sizes["step"] == 1
    s = icepop_lab.summary(ds)
    assert s.loc["GRPO", "masked_permille"] == 0  # vanilla GRPO zeroes nothing
    assert all(math.isfinite(v) and v >= 0 for v in s["mismatch_kl_k3"])
    assert 0 <= s.loc["IcePop", "masked_permille"] <= 1000
    assert isinstance(icepop_lab.figure(ds), Figure)
