"""Attribution on the minirl engine finds the knob planted in an otherwise aligned engine."""

from __future__ import annotations

import pytest

from aligntools import attribute
from minirl import Knobs

# Decoys: typical values whose fp32 effect is ~1e-7 (fp32 summation order), far below a
# planted precision fault (~1e-3 on mean |Δ logprob|, measured on tiny-qwen3-moe).
DECOYS = dict(attention="sdpa", topk="unstable", expert_sum_order="topk_slot", activation="fused_silu_mul")


@pytest.mark.parametrize("planted", [{"rmsnorm": "bf16_compute"}, {"router_dtype": "bfloat16"}])
def test_planted_knob_ranks_first(moe, planted):
    knobs = Knobs.aligned().replace(**DECOYS, **planted)
    # an eager trainer, so the engine's sdpa is a decoy (against a stock sdpa trainer it is aligned)
    a = attribute(moe, infer_knobs=knobs, train="hf,attn=eager", dtype="float32", tokens=96, progress=False)
    (name,) = planted
    assert a.ranked[0] == name
    assert set(a.ranked) == {name, *DECOYS}
    assert a.table.loc[name, "share"] > 0.9
    assert a.table.loc[a.ranked[1], "share"] < 0.05
    assert a.residual_gap < 1e-5  # fp32 with every knob aligned: summation-order noise only


def test_typical_bf16_leaves_a_dtype_residual(moe):
    a = attribute(moe, tokens=96, progress=False)  # Knobs.typical_inference(), bfloat16
    assert a.baseline_gap > a.residual_gap > 1e-4  # bf16 weights/activations: not a knob
    assert a.table.loc["residual (dtype)", "share"] > 0.2
    typical, aligned = Knobs().to_dict(), Knobs.aligned().replace(attention="sdpa").to_dict()  # the trainer's
    assert len(a.table) == sum(typical[k] != aligned[k] for k in typical) + 1


def test_unknown_knob_is_rejected(moe):
    with pytest.raises(ValueError, match="unknown knob"):
        attribute(moe, knobs=["rmsnorm", "warp_speed"], progress=False)
