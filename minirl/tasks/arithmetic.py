"""Multi-digit addition and subtraction, ``Q: 37+45= A: 82``."""

from __future__ import annotations

import random
from dataclasses import dataclass

from minirl.tasks.base import Problem, answer_text


@dataclass(frozen=True)
class Arithmetic:
    """Operands with up to ``digits`` digits; subtraction keeps the result >= 0."""

    digits: int = 2
    name: str = "arithmetic"

    def sample(self, rng: random.Random) -> Problem:
        hi = 10 ** self.digits - 1
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        if rng.random() < 0.5:
            return Problem(f"Q: {a}+{b}= A:", str(a + b), {"value": a + b})
        a, b = max(a, b), min(a, b)
        return Problem(f"Q: {a}-{b}= A:", str(a - b), {"value": a - b})

    def verify(self, problem: Problem, completion: str) -> bool:
        text = answer_text(completion)
        return text.lstrip("-").isdigit() and int(text) == problem.meta["value"]
