"""The fp16-against-bf16 entry (labs/precision_lab.py): its verdict follows the rule stated before
the runs, and ``python -m labs.reproduce --only fp16 --small`` measures both arms on one set of
prompts and seeds and says what the numbers say."""

from __future__ import annotations

import json

import pandas as pd
import pytest

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
    assert (tmp_path / "fp16" / "fp16.png").exists()


def test_a_dtype_that_overflows_on_the_model_is_said_not_averaged():
    """Gemma 3 270M in fp16: the engine's logits overflow to NaN in every seed; the verdict says so."""
    table = _table([3.0e-3, 3.2e-3, 2.9e-3], [float("nan")] * 3)
    table.loc[table["dtype"] == "float16", "non_finite"] = 1.0
    text, numbers = precision_lab.verdict(table)
    assert text.startswith("fp16 overflows on this model: the engine's logits were not finite in all 3 seeds")
    assert numbers["holds"] == 0.0
