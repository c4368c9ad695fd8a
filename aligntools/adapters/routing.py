"""How softmax top-k routers pick experts, for engines whose router returns only logits.

transformers' routers (Mixtral, Qwen3-MoE, OLMoE) and vLLM/SGLang's ``fused_topk`` agree:
fp32 softmax over the logits, top-k, optional renormalisation of the k weights.
"""

from __future__ import annotations

import torch


def route_softmax_topk(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (top-k weights [T, k] fp32, top-k expert ids [T, k])."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids
