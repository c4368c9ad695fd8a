"""Quantized-rollout and deep-MoE router-replay measurements (labs.quant_lab, labs.routing_lab)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure


def test_layer_flips_counts_changed_sets_not_orders():
    from labs.routing_lab import layer_flips

    trainer = [torch.tensor([[[0, 1], [2, 3]], [[0, 1], [2, 3]]])]  # 1 sequence, 2 positions, 2 layers, top-2
    engine = [torch.tensor([[[1, 0], [2, 4]], [[0, 1], [3, 2]]])]  # same set reordered / one real flip
    rates = layer_flips(trainer, engine, [5, 7])
    assert list(rates.index) == [5, 7] and rates.tolist() == [0.0, 0.5]


def test_measure_reports_each_format_on_the_sampled_tokens(zoo):
    from labs import quant_lab

    zoo("tiny-qwen3-moe")
    t = quant_lab.measure("tiny-qwen3-moe", formats=("none", "int4"), prompts=2, n=2, prompt_tokens=8,
                          max_new_tokens=6, progress=False)
    assert list(t.index) == ["none", "int4"] and (t["tokens"] > 0).all()
    assert t.loc["int4", "abs_dlogp_mean"] > t.loc["none", "abs_dlogp_mean"] > 0
    assert (t["abs_dlogp_max"] >= t["abs_dlogp_mean"]).all() and t["flip_rate"].between(0, 1).all()
    assert t["icepop_masked_permille"].between(0, 1000).all()
    md = quant_lab.markdown([t]).splitlines()
    assert len(md) == 4 and md[3].startswith("| tiny-qwen3-moe | int4 (bfloat16 activations) |")


def test_measure_on_a_dense_model_has_no_flip_rate(zoo):
    from labs import quant_lab

    zoo("tiny-llama")
    t = quant_lab.measure("tiny-llama", formats=("int8",), prompts=2, n=1, prompt_tokens=8, max_new_tokens=4,
                          progress=False)
    assert math.isnan(t.loc["int8", "flip_rate"]) and "| — |" in quant_lab.markdown([t])
    bf16 = quant_lab.measure("tiny-llama", formats=("int8",), prompts=2, n=1, prompt_tokens=8, max_new_tokens=4,
                             trainer_dtype="bfloat16", progress=False)
    assert bf16.attrs["trainer"] == "hf:bfloat16" and t.attrs["trainer"] == "hf:float32"
    assert bf16.loc["int8", "abs_dlogp_mean"] != t.loc["int8", "abs_dlogp_mean"]  # another trainer scored


@pytest.mark.slow
def test_depth_comparison_runs_on_the_deep_moe(zoo):
    from labs import routing_lab

    zoo("tiny-moe-deep")
    summary, flips = routing_lab.depth_comparison(models=("tiny-moe-deep",), weights=("none",), prompts=2, n=1,
                                                  max_new_tokens=4, progress=False)
    row = summary.loc[("tiny-moe-deep", "bf16")]
    assert row["layers"] == 16 and len(flips) == 16 and flips.notna().all().all()
    assert row["R3_factor_mean"] == pytest.approx(row["mean_no_replay"] / row["mean_R3"])
    assert row["flip_rate"] == pytest.approx(float(flips.mean().iloc[0]))
    assert isinstance(routing_lab.depth_figure(summary, flips), Figure) and isinstance(summary, pd.DataFrame)
    bf16, _ = routing_lab.depth_comparison(models=("tiny-moe-deep",), weights=("none",), prompts=2, n=1,
                                           max_new_tokens=4, trainer_dtype="bfloat16", progress=False)
    assert bf16.loc[("tiny-moe-deep", "bf16"), "mean_no_replay"] != row["mean_no_replay"]  # another trainer scored
