"""Per-step mismatch statistics and records, shared by every trainer integration.

Why raw, pre-truncation numbers: trainers log the importance ratio after their own clipping or
masking (TRL's ``vllm_importance_sampling_mode`` zeroes whole sequences by default), which hides
how large the engine/trainer gap really was. Here the ratio is ``exp(trainer - engine)`` per token
before any of that, its tail as quantiles, the effective sample size of the weights it implies,
and |Δ logprob| split by token probability, where a bf16 engine's gap concentrates.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from aligntools.audit.numeric import PROB_BUCKETS
from aligntools.records import Record, write_jsonl

QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)
"""Quantiles of the per-token ratio: the tails are where truncation acts."""
PREFIX = "mismatch"
"""Namespace of every logged key (TRL's own are ``sampling/...``): the two sets sit side by side."""


def mismatch_stats(trainer_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Statistics of ``exp(trainer_lp - engine_lp)`` over the tokens ``mask`` keeps.

    ``trainer_lp``, ``engine_lp``: [B, T] logprobs of the sampled tokens; ``mask``: [B, T], nonzero
    where a token is a real completion token. Tokens whose engine logprob is NaN (vLLM could not
    score them) are left out, not counted as zero: zero would understate the gap. Returns {} when
    no token is left, so a step without tokens logs nothing rather than NaN.
    """
    diff = (trainer_lp.detach().double() - engine_lp.detach().double())  # [B, T]
    keep = mask.bool() & ~torch.isnan(diff)  # [B, T]
    if not keep.any():
        return {}
    log_ratio = diff[keep]  # [N]
    ratio = log_ratio.exp()  # [N]
    seq_log_ratio = diff.where(keep, 0.0).sum(-1)[keep.any(-1)]  # [B'] sum over each sequence's tokens
    out = {f"{PREFIX}/ratio/mean": ratio.mean(), f"{PREFIX}/ratio/min": ratio.min(),
           f"{PREFIX}/ratio/max": ratio.max(),
           **{f"{PREFIX}/ratio/q{q * 100:g}": ratio.quantile(q) for q in QUANTILES},
           f"{PREFIX}/seq_ratio/min": seq_log_ratio.min().exp(), f"{PREFIX}/seq_ratio/max": seq_log_ratio.max().exp(),
           f"{PREFIX}/ess/token": ess(log_ratio), f"{PREFIX}/ess/sequence": ess(seq_log_ratio),
           f"{PREFIX}/abs_dlogp/mean": log_ratio.abs().mean()}
    prob = engine_lp.detach().double()[keep].exp()  # [N] the engine's probability of the sampled token
    for lo, hi in zip(PROB_BUCKETS, PROB_BUCKETS[1:]):
        inside = (prob >= lo) & ((prob < hi) if hi < 1.0 else (prob <= hi))
        if inside.any():
            out[f"{PREFIX}/abs_dlogp/p{lo:g}-{hi:g}"] = log_ratio[inside].abs().mean()
    return {k: float(v) for k, v in out.items()}


def ess(log_weights: torch.Tensor) -> torch.Tensor:
    """Effective sample size of importance weights ``exp(log_weights)`` [N] as a fraction of N:
    (Σw)² / (N Σw²), 1 when every weight is equal. Computed from logs so a huge ratio cannot overflow."""
    w = (log_weights - log_weights.max()).exp()  # [N], scale cancels in the ratio
    return w.sum() ** 2 / (w.numel() * (w * w).sum())


def records_of(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
               completion_mask: torch.Tensor, logprobs: torch.Tensor, sampling: Mapping[str, float],
               step: int | None, logprobs_mode: str | None) -> list[Record]:
    """One ``Record`` per row of a padded batch: ``prompt_ids`` / ``prompt_mask`` [B, P] (any padding
    side), ``completion_ids`` / ``completion_mask`` / ``logprobs`` [B, T] right-padded.

    Rows the audit cannot read as one single-turn sample are left out: a completion mask with holes
    (tool or environment tokens inside), or a token the engine gave no logprob for (NaN). Logprobs
    are clamped at 0: a bf16 engine's log_softmax can round a near-certain token to +1e-3, which the
    record format refuses as not a log-probability.
    """
    out = []
    for b in range(prompt_ids.shape[0]):
        n = int(completion_mask[b].sum())
        lp = logprobs[b, :n].double()  # [n]
        if n == 0 or not completion_mask[b, :n].bool().all() or torch.isnan(lp).any():
            continue
        out.append(Record(tuple(prompt_ids[b][prompt_mask[b].bool()].tolist()), tuple(completion_ids[b, :n].tolist()),
                          tuple(lp.clamp(max=0.0).tolist()), sampling=dict(sampling), logprobs_mode=logprobs_mode,
                          step=step))
    return out


def write_step(records: list[Record], folder: str | Path, step: int) -> Path:
    """``records`` as ``folder/step-000012.jsonl``: one file per step, so ``mlab audit`` can read any
    single step, and a crashed run keeps every finished step."""
    path = Path(folder) / f"step-{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_jsonl(records, path)
