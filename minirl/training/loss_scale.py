"""Dynamic loss scaling for an fp16 compute copy (``trainer_dtype: float16``).

Why: fp16 has 3 more mantissa bits than bf16 (Qi et al., arXiv 2510.26788, argue they remove most
of the train-inference mismatch) but 8 fewer exponent bits: gradients below 2^-24 flush to zero.
Mixed-precision trainers therefore multiply the loss by a large scale S before the backward and
divide the fp32 gradients by S after it; when a gradient overflows to inf, the step is skipped and
S halves; after ``growth_interval`` clean steps S doubles (Micikevicius et al. 2018, §3.2; the
defaults are torch.amp.GradScaler's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class LossScale:
    scale: float = 2.0**16  # GradScaler's init_scale
    growth_interval: int = 2000  # clean steps before the scale doubles
    growth: float = 2.0
    backoff: float = 0.5
    clean_steps: int = 0

    def update(self, finite: bool) -> None:
        """After each optimizer step's gradient check: back off on inf/NaN, grow after a clean run."""
        if not finite:
            self.scale, self.clean_steps = max(self.scale * self.backoff, 1.0), 0
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval and math.isfinite(self.scale * self.growth):
            self.scale, self.clean_steps = self.scale * self.growth, 0

    def state(self) -> dict[str, float]:
        return {"loss_scale": self.scale, "loss_scale_clean_steps": self.clean_steps}

    def restore(self, state: dict) -> None:
        """From a checkpoint's state (a checkpoint without one keeps the initial scale)."""
        self.scale = float(state.get("loss_scale", self.scale))
        self.clean_steps = int(state.get("loss_scale_clean_steps", 0))
