"""Group-relative advantages (GRPO) from one scalar reward per sample.

Rollouts come prompt-major: ``rewards[g * G + i]`` is sample ``i`` of prompt ``g`` (the order
``Engine.generate`` returns with ``SamplingParams(n=G)``).
"""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """``A_i = (r_i - mean_group) / (std_group + eps)`` (GRPO, DeepSeekMath §4.1.2), or
    ``r_i - mean_group`` with ``normalize_std=False`` (Dr.GRPO, Liu et al. 2025 §3.1: dividing
    by the std up-weights groups that are nearly all right or all wrong). ``std`` is the
    unbiased sample std of the group. rewards [N] -> advantages [N] float32."""
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: group-relative advantages need >= 2 samples per "
                         f"prompt (with 1 every advantage is 0); set group_size >= 2")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} cannot be split into groups of "
                         f"{group_size}; pass a flat [n_prompts * group_size] tensor")
    r = rewards.float().view(-1, group_size)  # [P, G]
    adv = r - r.mean(-1, keepdim=True)
    if normalize_std:
        adv = adv / (r.std(-1, keepdim=True) + eps)
    return adv.view(-1)


def drgrpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO: ``r_i - mean_group`` (no std normalisation)."""
    return grpo_advantages(rewards, group_size, normalize_std=False)
