"""MoE router: scoring, top-k selection with explicit tie-breaking, renormalisation, replay.

Ring-linear §5.2.1 (MoE): keep the router in high precision and replace the non-stable
``torch.topk`` with a stable implementation. Two tokens that see the same logits must pick the
same experts in the trainer and in the inference engine; with bf16 scores ties are common
(the softmax output has 8 mantissa bits), and a tie broken differently changes the expert,
which is a large, discrete mismatch.

Call contract: ``router_topk(logits[N, E], k, *, scoring="softmax"|"sigmoid",
renormalize=True, compute_dtype=None) -> (ids[N, k] int64, weights[N, k])``. Semantics follow
transformers Qwen3-MoE / Mixtral: scores over *all* experts (softmax or sigmoid) in
``compute_dtype``, top-k of the scores, optional division by their sum. ``compute_dtype=None``
means fp32 (float64 for float64 logits, so float64 runs are ground truth). Weights come back in
the compute dtype; the caller casts them. ``ids`` are sorted by descending score.
"""

from __future__ import annotations

import torch

from . import _checks, _triton
from .registry import register

SCORINGS = ("softmax", "sigmoid")


def check(logits: torch.Tensor, k: int, scoring: str, compute_dtype: torch.dtype | None) -> torch.dtype:
    """Validate (unless ``_checks.trusted()``) and return the compute dtype."""
    if not _checks.skipped():
        _checks.floating("logits", logits)
        _checks.ndim("logits", logits, 2, "[N, E]")
        n_experts = logits.shape[1]
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n_experts:
            raise ValueError(f"k must be an int in [1, num_experts={n_experts}] for "
                             f"{_checks.describe('logits', logits)}, got {k!r}")
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise TypeError(f"compute_dtype must be a floating dtype, got {compute_dtype}")
    return _checks.compute_dtype(logits.dtype) if compute_dtype is None else compute_dtype


def scores(logits: torch.Tensor, scoring: str, compute: torch.dtype) -> torch.Tensor:
    """Router probabilities over all experts, [N, E] in ``compute`` (HF: ``softmax(dtype=float)``;
    with a bf16 ``compute`` torch's softmax still reduces in fp32 and rounds the output)."""
    z = logits.to(compute)
    return torch.softmax(z, dim=-1) if scoring == "softmax" else torch.sigmoid(z)


def renorm(weights: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE ``norm_topk_prob`` / DeepSeek-V3 ``norm_topk_prob``: divide by the top-k sum."""
    return weights / weights.sum(dim=-1, keepdim=True)


def _select(s: torch.Tensor, k: int, scan: torch.Tensor, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of ``s[N, E]`` where, among equal scores, the expert that comes first in ``scan[N, E]``
    (a per-row permutation of expert ids) wins. A stable descending sort implements exactly that."""
    visited = s.gather(1, scan)  # [N, E] scores in scan order
    order = torch.sort(visited, dim=-1, descending=True, stable=True).indices[:, :k]  # [N, k]
    ids = scan.gather(1, order)  # [N, k] int64 expert ids
    w = s.gather(1, ids)
    return ids, (renorm(w) if renormalize else w)


@register("router_topk", "stable")
def stable(
    logits: torch.Tensor,
    k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic top-k: on equal scores the lowest expert id wins, whatever the batch.

    Who: Ring-linear's aligned setting (§5.2.1 "the non-stable torch.topk function must be
    replaced with a stable implementation"); equals transformers Qwen3-MoE/Mixtral routing
    whenever there are no ties. Why it differs from the engines' default: ``torch.topk`` and
    GPU radix/bitonic selects do not promise any tie order.
    """
    compute = check(logits, k, scoring, compute_dtype)
    s = scores(logits, scoring, compute)  # [N, E]
    scan = torch.arange(s.shape[1], device=s.device).expand_as(s)
    return _select(s, k, scan, renormalize)


@register("router_topk", "unstable")
def unstable(
    logits: torch.Tensor,
    k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Order-dependent tie-breaking: row ``i`` of the batch scans experts starting at id ``i % E``.

    Who: an *emulation* of what a non-stable GPU top-k does. CUDA ``torch.topk`` (radix select)
    and fused MoE gating kernels resolve ties by thread/warp scheduling and memory layout, so
    the winner of a tie depends on where the token sits in the batch — a token decoded alone
    (row 0) and the same token inside a prefill batch (row p) can pick different experts. Real
    kernels are not reproducible on CPU, so this variant makes the dependence deterministic
    and testable: it breaks ties by the row's rotated expert order. Without ties it equals
    ``stable`` exactly.
    """
    compute = check(logits, k, scoring, compute_dtype)
    s = scores(logits, scoring, compute)  # [N, E]
    n, e = s.shape
    rows = torch.arange(n, device=s.device)[:, None]
    scan = (torch.arange(e, device=s.device)[None, :] + rows) % e  # [N, E] rotated expert order
    return _select(s, k, scan, renormalize)


@register("router_topk", "torch")
def torch_topk(
    logits: torch.Tensor,
    k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain ``torch.topk``: exactly what transformers' Qwen3-MoE/Mixtral routing calls.

    Who: the stock HF training engine. Why it differs from ``stable``: torch does not promise
    a tie order, and bf16 router scores tie exactly more often than one expects (a few tokens
    in a thousand on the zoo MoE), so reproducing a stock trainer bit for bit needs the same
    call, not just the same math.
    """
    compute = check(logits, k, scoring, compute_dtype)
    s = scores(logits, scoring, compute)  # [N, E]
    w, ids = torch.topk(s, k, dim=-1)  # [N, k]
    return ids, (renorm(w) if renormalize else w)


@register("router_topk", "stable", impl="triton")
def stable_triton(
    logits: torch.Tensor,
    k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton kernel computing ``stable``: scores, k rounds of arg-max with the lowest id winning
    ties (``tie_break_left``), renormalisation, a block of tokens per program.

    Who: the fused gating kernels of inference engines (vLLM ``topk_softmax``, SGLang) fuse these
    steps the same way; this one is tie-stable on purpose. ``compute_dtype`` fp32/float64 run
    natively; bf16/fp16 round the scores and the sum to that dtype like torch would.
    """
    compute = check(logits, k, scoring, compute_dtype)
    mod = _triton.load("triton_router", logits)
    return mod.router_topk(logits, k, scoring=scoring, renormalize=renormalize, compute=compute)


def replay_gate(
    logits: torch.Tensor, ids: torch.Tensor, *, scoring: str = "softmax", renormalize: bool = True
) -> torch.Tensor:
    """Router replay: gate weights for *replayed* expert ids from *fresh* router logits.

    ``weights[N, k] = scores(logits)[n, ids[n]]`` (renormalised if asked), scores over all
    experts in fp32 (float64 for float64 logits). The selection is taken from the rollout
    (R3: recorded by the inference engine; R2: recorded in the trainer's old-logprob pass), so
    trainer and engine use the same experts, while the weights stay differentiable w.r.t. the
    trainer's logits — the router keeps learning (docs/conventions.md; verl
    ``router_replay_patch.py``, slime ``routing_replay.py``).
    """
    _checks.floating("logits", logits)
    _checks.ndim("logits", logits, 2, "[N, E]")
    _checks.integer("ids", ids)
    _checks.ndim("ids", ids, 2, "[N, k]")
    _checks.dim_matches("logits", logits, 0, "ids", ids, 0)
    _checks.same_device(logits=logits, ids=ids)
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    n_experts = logits.shape[1]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_experts):
        raise ValueError(f"{_checks.describe('ids', ids)} must lie in [0, {n_experts}) for {_checks.describe('logits', logits)}")
    s = scores(logits, scoring, _checks.compute_dtype(logits.dtype))  # [N, E]
    w = s.gather(1, ids.long())  # [N, k]
    return renorm(w) if renormalize else w
