"""The noise floor and cause ``numeric``: the gap left once the semantic causes are applied.

Why a measured floor: a gap of 1e-6 nats is two correct fp32 engines, 3e-2 a bf16 one; a fixed
threshold is either flaky or blind. The floor is the trainer's own fp32 logprobs against the same
model in float64 on the first records, and never below the gate's float32 drift
(``aligntools.analyzer.tolerance.DTYPE_RULES``, a relative error) times the logprobs' size; the limit
is the gate's ``k * floor + atol``.
"""

from __future__ import annotations

import torch

from aligntools.analyzer.tolerance import DTYPE_RULES

FLOOR_RECORDS = 4
"""Records scored in float64 for the floor (float64 costs ~2x fp32 per token on CPU)..."""
FLOOR_TOKENS = 32
"""...on their first this many completion tokens: the floor is a per-token rounding statistic, 128 tokens
measure it, and float64 is slow on CPU (4 x 64 smollm2 tokens cost 6.6 core-seconds, the float64 copy of
the model included; whole 256-token records cost more than all the fits together)."""
PROB_BUCKETS = (0.0, 0.01, 0.1, 0.5, 1.0)
"""Token-probability edges of the per-bucket report: low-probability tokens carry most of a bf16 gap."""


def limit(lp32: torch.Tensor, lp64: torch.Tensor) -> tuple[float, float]:
    """(floor, limit) in nats from the trainer's fp32 and float64 logprobs of the same tokens [n]."""
    rule = DTYPE_RULES["float32"]
    floor = max(float((lp32.double() - lp64).abs().mean()), rule.floor * float(lp64.abs().mean()))
    return floor, rule.limit(floor)


def remainder(engine: torch.Tensor, model: torch.Tensor, position: torch.Tensor) -> dict:
    """The per-token gap [N] split by the model's token probability and by position in the completion."""
    err = (engine - model).abs()
    prob = model.exp()
    out = {}
    for lo, hi in zip(PROB_BUCKETS, PROB_BUCKETS[1:]):
        sel = (prob >= lo) & (prob < hi if hi < 1 else prob <= hi)
        out[f"p[{lo:g},{hi:g})"] = {"tokens": int(sel.sum()), "mean_abs": float(err[sel].mean()) if sel.any() else 0.0}
    half = int(position.max()) // 2
    for name, sel in (("first half", position <= half), ("second half", position > half)):
        out[name] = {"tokens": int(sel.sum()), "mean_abs": float(err[sel].mean()) if sel.any() else 0.0}
    return out
