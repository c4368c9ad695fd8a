"""Cause ``routing``: the engine routed tokens to other experts than the trainer does.

Signature: the recorded ``routed_experts`` differ from the trainer's top-k, and replaying the recorded
experts in the trainer (R3: the recorded ids, the trainer's router weights at them) closes the gap.
Reported per layer (flip rate: share of tokens whose top-k *set* differs), the share of tokens with at
least one flipped layer, and the flipped tokens' router margin against the others' (a flip at a small
margin is numeric noise crossing a tie; at a large one, a different router).
"""

from __future__ import annotations

import numpy as np
import torch

from aligntools.audit.registry import Fit, register_cause
from aligntools.audit.state import Context, State
from aligntools.records import RecordError


def flips(recorded: list[np.ndarray], trainer: list[np.ndarray], margins: list[np.ndarray]) -> dict:
    """Flip statistics of recorded vs trainer expert ids, each per record [S, layers, top_k] (the
    recorded may have one more row, the last token's, which the trainer never routes)."""
    rows = [np.sort(r[: len(t)], -1) != np.sort(t, -1) for r, t in zip(recorded, trainer)]
    flipped = np.concatenate([r.any(-1) for r in rows])  # [tokens, layers]
    margin = np.concatenate(margins)  # [tokens, layers]
    return {"flip_rate_per_layer": flipped.mean(0).tolist(), "tokens_with_flip": float(flipped.any(1).mean()),
            "flip_margin_median": float(np.median(margin[flipped])) if flipped.any() else None,
            "kept_margin_median": float(np.median(margin[~flipped])) if (~flipped).any() else None}


def stats(ctx: Context) -> dict | None:
    """Flip statistics of the records against the trainer, or None when the records carry no experts."""
    if not all(r.routed_experts is not None for r in ctx.records) or ctx.routing is None:
        return None
    for i, (r, t) in enumerate(zip(ctx.records, ctx.routing)):
        if r.routed_experts.shape[1:] != t.shape[1:]:
            layers, k = r.routed_experts.shape[1:]
            raise RecordError(f"record {i}: routed_experts has {layers} layers x top-{k}, the model routes "
                              f"{t.shape[1]} MoE layers x top-{t.shape[2]}: audit with the model that produced the records")
    return flips([r.routed_experts for r in ctx.records], ctx.routing, ctx.margins)


@register_cause("routing")
def routing(ctx: Context, state: State) -> Fit | None:
    """Replay the recorded experts in the trainer; the replayed logits are the state's."""
    found = stats(ctx)
    if found is None or found["tokens_with_flip"] == 0:
        return None
    fix = ("the engine's routers chose other experts: replay the rollout's routed experts in the trainer (R3, "
           "minirl router_replay: r3), or align the router's precision (fp32 router logits on both sides)")
    return Fit("routing", found["tokens_with_flip"], "tokens with a flip", lambda c, s: s.with_logits(_replayed(c)),
               fix, found)


def _replayed(ctx: Context) -> torch.Tensor:
    """The trainer's logits [N, V] with every record's recorded experts forced."""
    return ctx.rescore("routing:replay", [r.prompt_ids for r in ctx.records],
                       forced=[r.routed_experts for r in ctx.records])
