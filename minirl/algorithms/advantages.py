"""Group-relative advantages (GRPO) from one scalar reward per sample.

Rollouts come prompt-major: ``rewards[g * G + i]`` is sample ``i`` of prompt ``g`` (the order
``Engine.generate`` returns with ``SamplingParams(n=G)``). ``TrainConfig.advantage`` names one of
``ADVANTAGES``: each takes ``(rewards, group_size)``.
"""

from __future__ import annotations

import torch

from minirl.algorithms.registry import Registry

ADVANTAGES = Registry("advantage")
register_adv_est = ADVANTAGES.register


def grpo_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """``A_i = (r_i - mean_group) / (std_group + eps)`` (GRPO, DeepSeekMath §4.1.2), or
    ``r_i - mean_group`` with ``normalize_std=False`` (Dr.GRPO, Liu et al. 2025 §3.1: dividing
    by the std up-weights groups that are nearly all right or all wrong). ``std`` is the
    unbiased sample std of the group. rewards [N] -> advantages [N] float32.

    Computed in float64 after shifting each group by its first member: a group of identical
    rewards is then exactly 0 (no signal), whereas a float32 mean of 0.7s is not exactly 0.7 and
    the near-zero std would blow that rounding error up (0.056 for a group of eight 0.7s)."""
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: group-relative advantages need >= 2 samples per "
                         f"prompt (with 1 every advantage is 0); set group_size >= 2")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} cannot be split into groups of "
                         f"{group_size}; pass a flat [n_prompts * group_size] tensor")
    shifted = rewards.double().view(-1, group_size)  # [P, G]
    shifted = shifted - shifted[:, :1]  # same mean-free values and std, exact zeros for equal rewards
    adv = shifted - shifted.mean(-1, keepdim=True)
    if normalize_std:
        adv = adv / (shifted.std(-1, keepdim=True) + eps)
    return adv.float().view(-1)


@register_adv_est("grpo")
def grpo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO: ``(r - mean) / (std + 1e-6)`` per group."""
    return grpo_advantages(rewards, group_size)


@register_adv_est("drgrpo")
def drgrpo(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO: ``r - mean`` per group, no std division."""
    return grpo_advantages(rewards, group_size, normalize_std=False)
