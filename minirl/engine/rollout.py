"""``Rollout``: one sampled sequence - the contract between a rollout engine (minirl ``Engine``,
real vLLM) and the trainer, and what the alignment tools read."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """A generated sample.

    ``logprobs`` are **raw**: ``log_softmax`` of the engine's logits at the position that
    produced each token, *before* temperature / top-k / top-p (docs/conventions.md); that is
    what ``pi_infer`` means in the mismatch ratio, and what the trainer's forward recomputes.
    ``processed_logprobs`` (only with ``SamplingParams(return_processed_logprobs=True)``) are
    under the distribution actually sampled from.

    Routing (MoE models, for R3 router replay) follows the verl/slime/SGLang convention:
    the experts chosen **at a position when that position's token is fed as input**.
    ``prompt_routed_experts[p]`` is prompt position ``p`` (prefill) and
    ``routed_experts[t]`` is generated token ``t`` (the decode step that feeds it; the engine
    feeds the final token once more for this, so every row is real).
    ``torch.cat([prompt_routed_experts, routed_experts])`` lines up with
    ``prompt_ids + token_ids``, the sequence the trainer replays over. Shapes
    [positions, n_moe_layers, k], int64, layers in ``engine.moe_layers`` order.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: torch.Tensor  # [T] float32, raw
    finish_reason: str  # "stop" (a stop/eos id was sampled, and is the last token) | "length"
    processed_logprobs: torch.Tensor | None = None  # [T] float32
    routed_experts: torch.Tensor | None = None  # [T, n_moe_layers, k] int64
    prompt_routed_experts: torch.Tensor | None = None  # [P, n_moe_layers, k] int64
