"""The per-step statistics every integration logs, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from aligntools.integrations.stats import ess, mismatch_stats, records_of


def test_ratio_stats_are_raw_and_masked():
    """Two sequences; padding (mask 0) and a NaN engine logprob are left out; nothing is clipped."""
    trainer = torch.tensor([[-0.1, -2.0, -9.0], [-0.5, -0.2, 0.0]])
    engine = torch.tensor([[-0.1, -1.0, -1.0], [-0.7, float("nan"), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    s = mismatch_stats(trainer, engine, mask)
    kept = torch.tensor([0.0, -1.0, 0.2], dtype=torch.float64)  # trainer - engine where kept
    assert s["mismatch/ratio/mean"] == pytest.approx(kept.exp().mean().item())
    assert s["mismatch/ratio/min"] == pytest.approx(math.exp(-1.0))
    assert s["mismatch/ratio/max"] == pytest.approx(math.exp(0.2))
    assert s["mismatch/seq_ratio/min"] == pytest.approx(math.exp(-1.0))  # sequence 0: 0 + (-1)
    assert s["mismatch/seq_ratio/max"] == pytest.approx(math.exp(0.2))  # sequence 1: NaN token left out
    assert s["mismatch/abs_dlogp/mean"] == pytest.approx(0.4)
    # engine probabilities: exp(-0.1) = 0.90 in [0.5, 1]; exp(-1) = 0.37 and exp(-0.7) = 0.497 in [0.1, 0.5)
    assert s["mismatch/abs_dlogp/p0.5-1"] == pytest.approx(0.0)
    assert s["mismatch/abs_dlogp/p0.1-0.5"] == pytest.approx(0.6)
    assert "mismatch/abs_dlogp/p0-0.01" not in s


def test_ess_is_one_for_equal_weights_and_one_over_n_for_one_dominant():
    assert ess(torch.zeros(5)).item() == pytest.approx(1.0)
    assert ess(torch.tensor([0.0, -800.0, -800.0, -800.0])).item() == pytest.approx(0.25)
    assert ess(torch.tensor([1000.0, 1000.0])).item() == pytest.approx(1.0)  # no overflow from huge ratios


def test_no_kept_token_logs_nothing():
    assert mismatch_stats(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2)) == {}


def test_records_of_left_padded_prompts_drop_unreadable_rows():
    prompt_ids = torch.tensor([[0, 5, 6], [7, 8, 9], [4, 4, 4]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 1]])
    completion_ids = torch.tensor([[11, 12], [13, 0], [14, 15]])
    completion_mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    logprobs = torch.tensor([[-0.5, 1e-3], [-0.25, 0.0], [-0.1, float("nan")]])
    recs = records_of(prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs, {"temperature": 1.0}, 4,
                      "processed")
    assert [(r.prompt_ids, r.completion_ids, r.logprobs) for r in recs] == [((5, 6), (11, 12), (-0.5, 0.0)),
                                                                            ((7, 8, 9), (13,), (-0.25,))]
    assert all(r.step == 4 and r.sampling == {"temperature": 1.0} for r in recs)
