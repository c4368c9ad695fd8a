"""Zero-variance prompt handling (CompassMax §2.4.1, "Multi-Stage Zero-Variance Elimination").

A GRPO group whose rewards are all equal has zero advantage everywhere: its rollouts cost compute
and teach nothing. Three stages, each usable alone:

(a) ``dynamic_filter``: DAPO dynamic sampling (Yu et al. 2025, cited in §2.4.1) — drop groups with
    reward std 0 and draw more generation batches until the batch is full or a cap is reached.
(b) ``ZeroVarianceMonitor``: the per-step zero-variance rate, and an adaptive group size N. §2.4.1
    grows the sampling size N "and continuously monitored the zero-variance ratio", picking N on a
    cost / gain trade-off; we grow N by ``factor`` while the smoothed rate is above ``high`` and
    shrink it when below ``low`` (a hysteresis band, so N does not oscillate).
(c) ``reshape_zero_variance_advantages``: for the ~5 % of groups still zero-variance, §2.4.1 uses
    RL-ZVP (Le et al. 2025, arXiv 2509.21880): direction from correctness, magnitude from the
    (detached) token entropy. Rule implemented: all-correct group -> A_t = +α·H_t; all-wrong ->
    A_t = -α·(max_{t'} H_t' - H_t) (confident wrong tokens are pushed down hardest). This is our
    reading of RL-ZVP's entropy-guided shaping; CompassMax gives no formula of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

G = TypeVar("G")


def is_zero_variance(rewards: Sequence[float] | torch.Tensor) -> bool:
    r = torch.as_tensor(rewards, dtype=torch.float64)
    return r.numel() < 2 or bool((r == r[0]).all())


def zero_variance_rate(group_rewards: Sequence[Sequence[float]]) -> float:
    """Share of groups whose rewards are all equal (they teach GRPO nothing)."""
    if not group_rewards:
        raise ValueError("zero_variance_rate() needs at least one group's rewards")
    return sum(is_zero_variance(r) for r in group_rewards) / len(group_rewards)


@dataclass
class FilterResult(Generic[G]):
    groups: list[G]  # at most ``target`` groups with non-zero reward variance
    n_batches: int  # generation batches drawn
    zero_variance_rates: list[float]  # one per generation batch
    filled: bool  # False when max_batches ran out first (the step trains on fewer groups)


def dynamic_filter(sample_batch: Callable[[], Sequence[G]], rewards_of: Callable[[G], Sequence[float]],
                   target: int, max_batches: int) -> FilterResult[G]:
    """DAPO dynamic sampling: call ``sample_batch()`` (one generation batch of groups) until
    ``target`` informative groups are collected or ``max_batches`` batches were drawn."""
    if target < 1 or max_batches < 1:
        raise ValueError(f"target={target}, max_batches={max_batches}: both must be >= 1")
    kept: list[G] = []
    rates: list[float] = []
    while len(kept) < target and len(rates) < max_batches:
        batch = list(sample_batch())
        if not batch:
            raise ValueError("sample_batch() returned no groups; it must return one generation batch")
        zero = [is_zero_variance(rewards_of(g)) for g in batch]
        rates.append(sum(zero) / len(batch))
        kept += [g for g, z in zip(batch, zero) if not z]
    return FilterResult(kept[:target], len(rates), rates, len(kept) >= target)


@dataclass
class ZeroVarianceMonitor:
    """Zero-variance rate per step and an adaptive group size (§2.4.1, rollout stage)."""

    n: int = 8
    """current group size N (Ring-1T and CompassMax both train with 8 rollouts per prompt)."""
    n_min: int = 4
    n_max: int = 64
    high: float = 0.3
    """grow N while the smoothed rate is above this."""
    low: float = 0.1
    """shrink N while below this (compute is the cost side of §2.4.1's trade-off)."""
    factor: int = 2
    ema: float = 0.5
    """weight of the newest step in the smoothed rate."""
    history: list[float] = field(default_factory=list)
    smoothed: float | None = None

    def __post_init__(self) -> None:
        if not (1 <= self.n_min <= self.n <= self.n_max and 0 <= self.low < self.high <= 1
                and self.factor >= 2 and 0 < self.ema <= 1):
            raise ValueError("need 1 <= n_min <= n <= n_max, 0 <= low < high <= 1, factor >= 2, 0 < ema <= 1")

    def update(self, group_rewards: Sequence[Sequence[float]]) -> dict[str, float]:
        """Record one step's groups; returns metrics (``zero_variance_rate`` is this step's rate,
        ``group_size`` the N it was sampled with) and moves ``n`` for the next step."""
        return self.record(zero_variance_rate(group_rewards))

    def replay(self, rates: Sequence[float]) -> None:
        """Re-apply logged per-step rates (a resumed run): ``n`` ends where the run left it."""
        for rate in rates:
            self.record(rate)

    def record(self, rate: float) -> dict[str, float]:
        """One step's zero-variance rate -> metrics; moves ``n`` for the next step."""
        sampled_with = self.n
        self.history.append(rate)
        self.smoothed = rate if self.smoothed is None else self.ema * rate + (1 - self.ema) * self.smoothed
        if self.smoothed > self.high:
            self.n = min(self.n_max, self.n * self.factor)
        elif self.smoothed < self.low:
            self.n = max(self.n_min, self.n // self.factor)
        return {"zero_variance_rate": rate, "zero_variance_smoothed": self.smoothed,
                "group_size": float(sampled_with)}


def reshape_zero_variance_advantages(advantages: torch.Tensor, rewards: torch.Tensor,
                                     entropy: torch.Tensor, mask: torch.Tensor, *, alpha: float = 0.1,
                                     correct_threshold: float = 0.5) -> torch.Tensor:
    """One group: advantages, entropy, mask [N, T]; rewards [N]. Non-zero-variance groups come
    back unchanged (GRPO); zero-variance ones get the entropy-shaped advantages above.
    ``correct_threshold``: reward >= it counts as correct (0-1 verifier rewards)."""
    if not is_zero_variance(rewards):
        return advantages
    h = entropy.detach().masked_fill(~mask.bool(), 0.0)  # [N, T]
    if float(rewards[0]) >= correct_threshold:
        shaped = alpha * h
    else:
        h_max = entropy.detach().masked_fill(~mask.bool(), float("-inf")).amax(1, keepdim=True)  # [N, 1]
        shaped = -alpha * (h_max - h)
    return shaped.masked_fill(~mask.bool(), 0.0).to(advantages.dtype)
