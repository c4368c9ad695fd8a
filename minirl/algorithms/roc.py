"""GRPO-RoC selection (rStar2-Agent §2.2.3): oversample 2G rollouts, keep G.

Resample-on-Correct is asymmetric on purpose: positives (answer reward 1) are *filtered* toward
clean traces (few tool errors, well-formed answers) while negatives are *uniformly* downsampled
so that every failure mode keeps being shown to the policy.

How G is split (§2.2.3, "for successful rollouts O_pos ... we sample half of the trajectories"):
the paper halves the positives, and |O_pos| + |O_neg| = 2G makes the other half of G the
negatives. With an odd |O_pos| we keep ``ceil(|O_pos| / 2)`` positives (a lone correct rollout
is kept: it is the group's only positive signal) and ``G - that`` negatives, which is always
``floor(|O_neg| / 2)`` and so always available.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch

MODES = ("sample", "lowest")
_ANSWER_TAG = re.compile(r"</?answer>")


def tool_error_ratio(n_tool_calls: int, n_tool_errors: int) -> float:
    """rStar2-Agent Eq. 4: p_err = errors / calls, or 0.5 with no calls (to encourage tool use)."""
    if n_tool_calls < 0 or not 0 <= n_tool_errors <= max(n_tool_calls, 0):
        raise ValueError(f"need 0 <= n_tool_errors ({n_tool_errors}) <= n_tool_calls ({n_tool_calls})")
    return 0.5 if n_tool_calls == 0 else n_tool_errors / n_tool_calls


def format_penalty(n_answer_tags: int, n_turns: int) -> float:
    """rStar2-Agent Eq. 5: 1 with no <answer> tag, else min(1, (tags - 1) / turns) (repetition).
    n_answer_tags counts closed <answer>...</answer> blocks; from a text use answer_format_penalty."""
    if n_answer_tags < 0 or n_turns < 1:
        raise ValueError(f"n_answer_tags={n_answer_tags} must be >= 0 and n_turns={n_turns} >= 1")
    return 1.0 if n_answer_tags == 0 else min(1.0, (n_answer_tags - 1) / n_turns)


def answer_format_penalty(text: str, n_turns: int) -> float:
    """Eq. 5 on a trajectory's text. Only closed, matched blocks count, as rStar2-Agent's released
    roc.py checks: an unclosed, nested or closed-before-opened <answer> is a format violation and
    gets the maximum penalty 1, like no answer at all (counting "<answer>" alone scored it 0)."""
    tags = _ANSWER_TAG.findall(text)
    well_formed = tags == ["<answer>", "</answer>"] * (len(tags) // 2)
    return format_penalty(len(tags) // 2 if well_formed else 0, n_turns)


def roc_select(rewards: Sequence[float] | torch.Tensor, penalties: Sequence[float] | torch.Tensor,
               group_size: int, *, generator: torch.Generator, mode: str = "sample",
               eps: float = 0.01) -> list[int]:
    """Pick ``group_size`` (= G) of the 2G rollouts; returns sorted indices into the inputs.

    rewards: [2G] answer rewards (positive = reward > 0, the paper's 0-1 reward, Eq. 3).
    penalties: [2G] p_total = p_err + p_format (Eqs. 4-5); only positives' values matter.
    mode="sample": positives drawn without replacement with probability proportional to
    ``1 / (p_total + eps)`` (the paper's rule; ``eps`` keeps a zero-penalty trace finite: with
    0.01 it is 51x likelier than a p_total = 0.5 trace). mode="lowest": the positives with the
    lowest p_total (ties: lowest index), a deterministic ablation.
    Negatives are always drawn uniformly without replacement from ``generator``.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()  # [2G]
    p = torch.as_tensor(penalties, dtype=torch.float64).flatten()  # [2G]
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; valid: {MODES}")
    if r.numel() != 2 * group_size or p.numel() != r.numel():
        raise ValueError(f"GRPO-RoC needs 2G = {2 * group_size} rewards and penalties, got "
                         f"{r.numel()} and {p.numel()}: oversample twice the kept group size")
    if bool((p < 0).any()) or not eps > 0:
        raise ValueError("penalties must be >= 0 (p_err + p_format) and eps > 0")
    pos = (r > 0).nonzero().flatten()  # [P]
    neg = (r <= 0).nonzero().flatten()  # [2G - P]
    k_pos = math.ceil(pos.numel() / 2)
    k_neg = group_size - k_pos
    if mode == "lowest":
        order = sorted(pos.tolist(), key=lambda i: (float(p[i]), i))
        chosen_pos = torch.tensor(order[:k_pos], dtype=torch.long)
    elif k_pos:
        weights = 1.0 / (p[pos] + eps)  # [P]
        chosen_pos = pos[torch.multinomial(weights, k_pos, replacement=False, generator=generator)]
    else:
        chosen_pos = pos
    chosen_neg = neg[torch.randperm(neg.numel(), generator=generator)[:k_neg]]
    return sorted(torch.cat([chosen_pos, chosen_neg]).tolist())
