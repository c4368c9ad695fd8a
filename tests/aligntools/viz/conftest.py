"""A gate report like the demo's, built once: a real gate on the zoo MoE (64 tokens) plus two
attribution sections from the engine-free attribution arithmetic (seconds, not the demo's minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aligntools import check_alignment
from aligntools.replayer.attribution import Attribution, run_attribution
from labs.demo import attribution_section

DIFFERING = {"lm_head_dtype": ("act", "float32"), "activation": ("fused_silu_mul", "hf"),
             "expert_sum_order": ("topk_slot", "expert_id"), "rmsnorm": ("fused_add", "hf")}
EFFECT = {"lm_head_dtype": 0.3, "activation": 0.1, "expert_sum_order": 0.06, "rmsnorm": 0.0}


def toy_gap(changes: dict) -> float:
    """Gap 1.0 minus each aligned knob's effect, with an interaction so shares do not add up."""
    return max(0.0, 1.0 - sum(EFFECT[k] for k in changes) + 0.05 * (len(changes) > 1))


def toy_attribution(train: str) -> Attribution:
    table, g0, residual = run_attribution(toy_gap, DIFFERING, progress=False)
    return Attribution(table, g0, residual, dtype="bfloat16", train=train)


@pytest.fixture(scope="session")
def gate(moe):
    return check_alignment(moe, train="hf", infer="minirl", tokens=64, progress=False)


@pytest.fixture(scope="session")
def report_html(gate, tmp_path_factory) -> Path:
    r = gate.report()
    attribution_section(r, "Knob attribution (float32 trainer)", toy_attribution("hf"))
    attribution_section(r, "Knob attribution (bf16 trainer)", toy_attribution("hf:bfloat16"))
    return r.write(tmp_path_factory.mktemp("report") / "report.html")
