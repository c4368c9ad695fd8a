"""``old_logprobs: bypass`` measures the engine mismatch instead of logging NaN: the first
minibatch's update forward runs before any optimizer step, so its log-probs are pi_old's."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.driver import train
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import bypass_gap

GAP_KEYS = ("mismatch_kl_k1", "mismatch_kl_k3", "abs_dlogp_max", "icepop_band_out", "abs_dprob_mean")


def test_bypass_measures_the_same_gap_as_recompute_with_one_minibatch(quick_config):
    """One minibatch holds every row, so bypass's measurement covers what recompute's old-logprob
    forward covers, on the same step-0 rollouts (same seed): equal up to float rounding (the same
    forward, once with autograd and once without)."""
    rows = {mode: train(quick_config(steps=1, minibatches=1, engine="minirl:typical", old_logprobs=mode,
                                     out_dir=quick_config().out_dir + mode)).rows[0]
            for mode in ("recompute", "bypass")}
    for key in GAP_KEYS:
        assert math.isfinite(rows["bypass"][key]), key
        assert rows["bypass"][key] == pytest.approx(rows["recompute"][key], rel=1e-4, abs=1e-9), key
    assert rows["recompute"]["mismatch_kl_k3"] > 0  # bf16 rollouts: a gap to measure


def test_bypass_gap_covers_only_the_rows_the_first_minibatch_held():
    c = TrainConfig(model="x")
    infer = torch.log(torch.full((3, 4), 0.5, dtype=torch.float64)).float()
    mask = torch.ones(3, 4)
    fresh = torch.full((3, 4), math.nan)
    fresh[1] = torch.log(torch.tensor(0.25))  # row 1 measured: log rho = log 0.5 on its 4 tokens
    gap = bypass_gap(c, fresh, infer, mask)
    assert gap["mismatch_kl_k1"] == pytest.approx(math.log(2), rel=1e-6)  # -log rho, rows 0 and 2 left out
    assert gap["abs_dlogp_max"] == pytest.approx(math.log(2), rel=1e-6)
    assert all(math.isnan(v) for v in bypass_gap(c, torch.full((3, 4), math.nan), infer, mask).values())
