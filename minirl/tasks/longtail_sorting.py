"""Sort 1..``max_length`` digits, with a geometric length: ``Q: sort 5 2 9 A: 2 5 9``.

Why: most answers are short and a few are long, so a synchronous step's generation time is set
by its longest answers, the long tail of real RL rollouts that 1-step-off async (AsyncFlow §4)
and C3PO++ (Ring-1T §2.3.3) exist to hide. The length distribution is P(n) ∝ (1-p)^(n-1), cut
at ``max_length``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minirl.tasks.base import Problem
from minirl.tasks.sorting import is_sorted_answer


@dataclass(frozen=True)
class LongTailSorting:
    max_length: int = 12
    p: float = 0.35
    """per-number stop chance; the mean length is about 1/p."""
    name: str = "longtail_sorting"

    def __post_init__(self) -> None:
        if self.max_length < 1 or not 0 < self.p <= 1:
            raise ValueError(f"longtail_sorting needs max_length >= 1 and 0 < p <= 1, got "
                             f"max_length={self.max_length}, p={self.p}")

    def sample(self, rng: random.Random) -> Problem:
        n = 1
        while n < self.max_length and rng.random() > self.p:
            n += 1
        nums = [rng.randint(0, 9) for _ in range(n)]
        return Problem(f"Q: sort {' '.join(map(str, nums))} A:", " ".join(map(str, sorted(nums))),
                       {"sorted": sorted(nums)})

    def verify(self, problem: Problem, completion: str) -> bool:
        return is_sorted_answer(problem, completion)
