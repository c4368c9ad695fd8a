"""Sort a short list of numbers, ``Q: sort 5 2 9 A: 2 5 9``."""

from __future__ import annotations

import random
from dataclasses import dataclass

from minirl.tasks.base import Problem, answer_text


@dataclass(frozen=True)
class Sorting:
    """``length`` numbers in [0, ``max_number``], answer ascending, space separated."""

    length: int = 4
    max_number: int = 99
    name: str = "sorting"

    def sample(self, rng: random.Random) -> Problem:
        nums = [rng.randint(0, self.max_number) for _ in range(self.length)]
        return Problem(f"Q: sort {' '.join(map(str, nums))} A:", " ".join(map(str, sorted(nums))),
                       {"sorted": sorted(nums)})

    def verify(self, problem: Problem, completion: str) -> bool:
        return is_sorted_answer(problem, completion)


def is_sorted_answer(problem: Problem, completion: str) -> bool:
    """The completion's answer is the problem's numbers, ascending, space separated."""
    parts = answer_text(completion).split()
    return all(p.isdigit() for p in parts) and [int(p) for p in parts] == problem.meta["sorted"]
