"""The fp16-against-bf16 entry (labs/precision_lab.py): its verdict follows the rule stated before
the runs, and ``python -m labs.reproduce --only fp16 --small`` measures both arms on one set of
prompts and seeds and says what the numbers say."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from labs import precision_lab, reproduce


def _table(bf16: list[float], fp16: list[float]) -> pd.DataFrame:
    rows = [{"dtype": d, "seed": i, "mean_abs_dlogp": v, "max_abs_dlogp": 10 * v, "k3": v * v, "non_finite": 0.0}
            for d, values in (("bfloat16", bf16), ("float16", fp16)) for i, v in enumerate(values)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("bf16,fp16,reading,holds", [
    ([3.0e-3, 3.2e-3, 2.9e-3], [4e-4, 3e-4, 4.5e-4], "fp16 removes most of the mismatch", 1.0),
    ([3.0e-3, 0.2e-3, 6e-3], [4e-4, 3e-4, 4.5e-4], "intervals overlap: not shown at this seed count", 0.0),
    ([3.0e-3, 3.2e-3, 2.9e-3], [2.0e-3, 2.1e-3, 1.9e-3], "fp16 does not remove most of the mismatch here", 0.0),
])
def test_the_verdict_follows_its_rule(bf16, fp16, reading, holds):
    text, numbers = precision_lab.verdict(_table(bf16, fp16))
    assert text.endswith(reading) and numbers["holds"] == holds
    assert numbers["ratio"] == pytest.approx(sum(fp16) / sum(bf16))
    assert f"over {len(bf16)} seeds" in text


def test_fp16_small_runs_both_arms_on_the_same_prompts(tmp_path):
    assert reproduce.main(["--small", "--only", "fp16", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "fp16" / "summary.json").read_text())
    nums = summary["numbers"]
    assert nums["bf16_mean tiny-qwen3"] > 0 and nums["fp16_mean tiny-qwen3"] > 0
    assert summary["ours"].startswith("tiny-qwen3: mean |Δ logprob| fp16")
    assert (nums["fp16_mean tiny-qwen3"] < nums["bf16_mean tiny-qwen3"]) == (nums["ratio tiny-qwen3"] < 1)
    assert (tmp_path / "fp16" / "fp16.png").exists() and (tmp_path / "fp16" / "fp16_rl.png").exists()
    for d in precision_lab.DTYPES:  # the RL arms ran: a finite mismatch, a reward and a held-out accuracy
        assert nums[f"rl_mismatch {d}"] > 0 and 0 <= nums[f"rl_reward {d}"] <= 1 and 0 <= nums[f"rl_accuracy {d}"] <= 1
    assert "RL, 2 seeds x 2 steps: " in summary["ours"]
    assert nums["rl_ratio"] == pytest.approx(nums["rl_mismatch float16"] / nums["rl_mismatch bfloat16"])


def _rl(bf16: list[list[float]], fp16: list[list[float]]) -> xr.Dataset:
    """``rl_arms``' layout: per dtype, per seed a mismatch curve over steps, then the held-out row."""
    curves = np.array([[row + [np.nan] for row in arm] for arm in (bf16, fp16)])  # [dtype, seed, step + 1]
    reward = np.where(np.isnan(curves), np.nan, 0.5)
    accuracy = np.where(np.isnan(curves), 0.25, np.nan)  # only the held-out row has one
    dims = ("dtype", "seed", "step")
    return xr.Dataset({"abs_dlogp_mean": (dims, curves), "reward": (dims, reward), "eval_accuracy": (dims, accuracy)},
                      coords={"dtype": list(precision_lab.DTYPES), "seed": range(curves.shape[1]),
                              "step": range(curves.shape[2])})


FLAT = [[2e-4, 3e-4, 2e-4], [2e-4, 1e-4, 2e-4], [3e-4, 2e-4, 2.5e-4]]  # slopes 0, 0, -2.5e-5 per step


@pytest.mark.parametrize("bf16,fp16,holds,grows_bf16", [
    ([[3e-3, 4e-3, 5e-3]] * 2 + [[3.1e-3, 4.2e-3, 5.1e-3]], FLAT, True, True),
    ([[3e-3, 3e-3, 3e-3], [1e-4, 1e-4, 1e-4], [6e-3, 6e-3, 6e-3]], FLAT, False, False),
    ([[3e-3, 2e-3, 1e-3]] * 3, [[2.5e-3, 2e-3, 1e-3]] * 3, False, False),
    ([[0.0, 0.0, 0.0]] * 3, [[0.0, 0.0, 0.0]] * 3, False, False),  # both exactly 0: nothing kept down, no ratio
])
def test_the_rl_verdict_follows_its_rule(bf16, fp16, holds, grows_bf16):
    """fp16 holds only under half of bf16 with intervals apart; growth only with the slope's interval above 0;
    the held-out accuracy is read from the last row and the reward from the steps before it."""
    text, numbers = precision_lab.rl_verdict(_rl(bf16, fp16))
    assert numbers["rl_holds"] == float(holds) and numbers["rl_grows bfloat16"] == float(grows_bf16)
    assert numbers["rl_grows float16"] == 0.0  # no fp16 curve here rises
    assert ("fp16 keeps the mismatch down" in text) == holds and "3 seeds x 3 steps" in text
    assert numbers["rl_accuracy bfloat16"] == 0.25 and numbers["rl_reward float16"] == 0.5
    assert numbers["rl_mismatch bfloat16"] == pytest.approx(np.mean(bf16))
    assert (numbers["rl_ratio"] != numbers["rl_ratio"]) == (np.mean(bf16) == 0)  # NaN exactly when bf16 is 0


def test_a_dtype_that_overflows_on_the_model_is_said_not_averaged():
    """Gemma 3 270M in fp16: the engine's logits overflow to NaN in every seed; the verdict says so."""
    table = _table([3.0e-3, 3.2e-3, 2.9e-3], [float("nan")] * 3)
    table.loc[table["dtype"] == "float16", "non_finite"] = 1.0
    text, numbers = precision_lab.verdict(table)
    assert text.startswith("fp16 overflows on this model: the engine's logits were not finite in all 3 seeds")
    assert numbers["holds"] == 0.0
