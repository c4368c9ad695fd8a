"""A tool-using arithmetic task: products of large numbers, where a python call helps.

Answer-only 0-1 reward, as rStar2-Agent Eq. 3 (the tool is never rewarded directly; GRPO-RoC's
penalties only steer which correct trajectories are kept).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)

INSTRUCTIONS = (
    "Solve the problem. You may run Python by writing "
    '<tool_call>{"name": "python", "arguments": {"code": "print(...)"}}</tool_call>; '
    "the result comes back in <tool_response>...</tool_response>. "
    "Give the final integer in <answer>...</answer>.\n"
)


@dataclass(frozen=True)
class ArithmeticProblem:
    a: int
    b: int
    c: int

    @property
    def prompt(self) -> str:
        return f"{INSTRUCTIONS}Problem: compute {self.a} * {self.b} + {self.c}.\n"

    @property
    def answer(self) -> int:
        return self.a * self.b + self.c


def sample_problems(n: int, seed: int, digits: int = 5) -> list[ArithmeticProblem]:
    """``digits``-digit factors: hard to do in one's head, one line of Python."""
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    return [ArithmeticProblem(rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(0, hi)) for _ in range(n)]


def reward(problem: ArithmeticProblem, trajectory_text: str) -> float:
    """1.0 when the *last* <answer> holds the right integer, else 0.0 (unparseable counts as wrong)."""
    answers = _ANSWER.findall(trajectory_text)
    if not answers:
        return 0.0
    try:
        return float(int(answers[-1].strip().replace(",", "")) == problem.answer)
    except ValueError:
        return 0.0
