"""Sparse MoE block: router -> top-k -> experts batched per expert -> weighted sum.

Why tokens are grouped per expert: one GEMM per expert over all its tokens (what fused-MoE
kernels do) instead of one per token, and all experts in one padded batched GEMM so a decode
step costs a handful of ops, not a Python loop over experts. The per-(token, slot) outputs
are then combined in the order the ``expert_sum_order`` knob names (Ring-linear 5.2.1 MoE:
"a deterministic order for token permutation and summation").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minirl.engine.ops import act_mul

SUM_ORDERS = ("topk_slot", "expert_id", "grouped_mm")
Emit = Callable[[str, torch.Tensor], None]


@dataclass(frozen=True)
class MoEConfig:
    top_k: int
    renormalize: bool
    weights_in_logits_dtype: bool  # transformers' cast (Qwen3-MoE: True; Mixtral: False)
    router_dtype: torch.dtype
    topk_fn: Callable  # kernels router_topk variant
    sum_order: str
    activation: str
    tp: int
    act_quant: Callable[[torch.Tensor], torch.Tensor] | None = None  # Knobs.activations on the experts' inputs


def moe_forward(x: torch.Tensor, router_w: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                cfg: MoEConfig, emit: Emit | None, prefix: str, static: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, H] -> (out [N, H] in x.dtype, topk ids [N, k]).

    ``router_w`` [E, H] is stored in the router dtype; ``gate_up`` [E, 2I, H], ``down`` [E, H, I].
    ``static``: shapes that do not depend on the routing (see ``experts_forward``).
    """
    logits = F.linear(x.to(cfg.router_dtype), router_w)  # [N, E] router dtype
    ids, weights = cfg.topk_fn(logits, cfg.top_k, scoring="softmax", renormalize=cfg.renormalize,
                               compute_dtype=torch.float32)  # [N, k] int64, [N, k] fp32
    if cfg.sum_order != "topk_slot" and cfg.weights_in_logits_dtype:
        weights = weights.to(logits.dtype)  # transformers' Qwen3-MoE; fused MoE keeps fp32
    if emit:
        emit_routing(emit, prefix, logits, ids, weights)
    return experts_forward(x, ids, weights, gate_up, down, cfg, static), ids


def experts_forward(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, cfg: MoEConfig, static: bool = False) -> torch.Tensor:
    """The routed experts of x [N, H] for ``ids``/``weights`` [N, k] -> [N, H] in x.dtype. Split
    from the router so architectures with their own scoring (sigmoid + bias) share the dispatch.

    ``static`` (a CUDA-graph decode step): padded batching with room for all N tokens per
    expert, the most one expert can get (a token's k experts are distinct), so no shape is read
    back from the routing."""
    n, k = ids.shape
    flat = ids.reshape(-1)  # [P] (token, slot) pairs, token-major
    seen = F.one_hot(flat, gate_up.shape[0]).cumsum(0)  # [P, E] pairs routed to each expert so far
    if static:
        groups: _Padded | _Sorted = _Padded(flat, seen, cap=n)
    else:
        groups = _Padded(flat, seen) if _padding_is_cheap(seen) else _Sorted(flat, seen[-1])
    quant = cfg.act_quant or (lambda t: t)
    g = groups.group(quant(x).repeat_interleave(k, dim=0))  # pair rows, grouped by expert
    h = act_mul(groups.linear(g, gate_up), cfg.activation)  # [..., I]

    out = None
    inter = h.shape[-1]
    for r in range(cfg.tp):  # row-parallel down projection: rank r owns intermediate slice r
        cols = slice(r * inter // cfg.tp, (r + 1) * inter // cfg.tp)
        y = groups.ungroup(groups.linear(quant(h[..., cols]), down[..., cols])).view(n, k, -1)  # [N, k, H]
        part = _combine(y, weights, ids, cfg.sum_order)  # [N, H]
        out = part if out is None else out + part  # all-reduce in rank order
    return out


def _padding_is_cheap(seen: torch.Tensor) -> bool:
    """Padded batching when it at most doubles the GEMM rows (small decode batches, where the
    op count dominates); exact per-expert segments otherwise (prefill). Engines pick MoE
    kernels by batch size the same way."""
    n_pairs, n_exp = seen.shape
    return int(seen[-1].max()) * n_exp <= 2 * n_pairs


class _Padded:
    """All experts in one batched GEMM over [E, cap, D] (rows past an expert's count are zero
    and never read back)."""

    def __init__(self, flat: torch.Tensor, seen: torch.Tensor, cap: int | None = None) -> None:
        self.flat = flat
        self.pos = seen.gather(1, flat[:, None])[:, 0] - 1  # [P] row of each pair in its expert
        self.shape = (seen.shape[1], int(seen[-1].max()) if cap is None else cap)  # (E, cap)

    def group(self, pairs: torch.Tensor) -> torch.Tensor:  # [P, D] -> [E, cap, D]
        out = pairs.new_zeros(*self.shape, pairs.shape[1])
        out[self.flat, self.pos] = pairs
        return out

    def ungroup(self, grouped: torch.Tensor) -> torch.Tensor:  # [E, cap, D] -> [P, D]
        return grouped[self.flat, self.pos]

    def linear(self, grouped: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # w [E, O, D]
        return torch.bmm(grouped, w.transpose(1, 2))


class _Sorted:
    """Pairs sorted by expert, one GEMM per expert over its contiguous segment."""

    def __init__(self, flat: torch.Tensor, counts: torch.Tensor) -> None:
        self.order = flat.argsort(stable=True)  # [P]
        self.counts = counts.tolist()  # rows of each expert's segment, in expert order
        self.active = [e for e, c in enumerate(self.counts) if c]  # experts with tokens

    def group(self, pairs: torch.Tensor) -> torch.Tensor:  # [P, D] -> [P, D] sorted
        return pairs[self.order]

    def ungroup(self, grouped: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(grouped)
        out[self.order] = grouped
        return out

    def linear(self, grouped: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # w [E, O, D]
        """F.linear's own ``mm`` per expert, written in place into its segment: the views come
        from one split/unbind each, because per-expert slicing costs more than a decode GEMM."""
        out = grouped.new_empty(grouped.shape[0], w.shape[1])
        rows, dst, w_t = grouped.split(self.counts), out.split(self.counts), w.transpose(1, 2).unbind(0)
        for e in self.active:
            torch.mm(rows[e], w_t[e], out=dst[e])
        return out


def _combine(y: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, order: str) -> torch.Tensor:
    """Weighted sum over the k slots of y [N, k, H] -> [N, H] in y.dtype.

    ``topk_slot`` (fused MoE): the fp32 routing weight is applied in fp32 (vLLM's fused_moe
    GEMM epilogue), rounded, and slots are added one at a time in top-k order, in y.dtype.
    ``expert_id`` (transformers' per-expert loop, ``experts_implementation="eager"``): the
    weight is applied in its own dtype, rounded, and slots are added one at a time in ascending
    expert id (its ``index_add_``). ``grouped_mm`` (transformers' default experts path,
    ``integrations/moe.py``): the weight is applied in the promoted dtype (fp32 for Mixtral's
    fp32 weights), the k slots are summed by one ``sum`` (fp32 accumulation) and rounded once.
    With top-2 and bf16 weights the last two coincide; with top-8, or fp32 weights, they do not.
    """
    if order == "grouped_mm":
        return (y * weights[..., None]).sum(dim=1).to(y.dtype)
    if order == "topk_slot":
        yw = (y.float() * weights.float()[..., None]).to(y.dtype)
    else:
        yw = (y * weights[..., None]).to(y.dtype)
        perm = ids.argsort(dim=1, stable=True)  # [N, k]
        yw = yw.gather(1, perm[..., None].expand_as(yw))
    out = yw[:, 0]
    for j in range(1, yw.shape[1]):
        out = out + yw[:, j]
    return out


def emit_routing(emit: Callable, prefix: str, logits: torch.Tensor, ids: torch.Tensor,
                 weights: torch.Tensor) -> None:
    """The three routing sites of one MoE layer, in execution order (aligntools.sites)."""
    emit(prefix + "router_logits", logits)
    emit(prefix + "topk_ids", ids)
    emit(prefix + "topk_weights", weights)
