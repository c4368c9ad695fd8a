"""``python_tool``: products of large numbers, where one sandboxed Python call helps
(rStar2-Agent §2.2.2's tool format; the trainer runs it multi-turn through ``minirl.tasks.tool_calls``).

The reward is answer-only, 0 or 1, as rStar2-Agent Eq. 3: the tool is never rewarded directly
(GRPO-RoC's penalties only steer which correct trajectories are kept, ``downsample: roc``).
``Problem.answer`` is a whole tool trajectory (call, response, answer), the trace the SFT
warm-up teaches, so the model starts RL by writing its own tool calls.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from minirl.tasks.base import Problem

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)

INSTRUCTIONS = (
    "Solve the problem. You may run Python by writing "
    '<tool_call>{"name": "python", "arguments": {"code": "print(...)"}}</tool_call>; '
    "the result comes back in <tool_response>...</tool_response>. "
    "Give the final integer in <answer>...</answer>.\n"
)


@dataclass(frozen=True)
class PythonTool:
    """``a * b + c`` with ``digits``-digit factors: hard to do in one's head, one line of Python.
    ``instructions=False`` drops the format explanation from the prompt (a zoo model learns the
    format from the SFT warm-up alone, on sequences a third as long)."""

    digits: int = 5
    instructions: bool = True
    name: str = "python_tool"
    uses_tools = True  # the trainer generates multi-turn, running each <tool_call> in the sandbox

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"python_tool digits={self.digits}: need >= 1")

    def sample(self, rng: random.Random) -> Problem:
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        a, b, c = rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(0, hi)
        value = a * b + c
        call = json.dumps({"name": "python", "arguments": {"code": f"print({a} * {b} + {c})"}})
        trace = f"<tool_call>{call}</tool_call><tool_response>{value}\n</tool_response><answer>{value}</answer>"
        head = INSTRUCTIONS if self.instructions else ""
        return Problem(f"{head}Problem: compute {a} * {b} + {c}.\n", trace, {"value": value})

    def verify(self, problem: Problem, completion: str) -> bool:
        """True when the *last* <answer> holds the right integer (unparseable counts as wrong)."""
        answers = _ANSWER.findall(completion)
        try:
            return bool(answers) and int(answers[-1].strip().replace(",", "")) == problem.meta["value"]
        except ValueError:
            return False


def sample_problems(n: int, seed: int, digits: int = 5) -> list[Problem]:
    """``n`` seeded problems (for scripts and notebooks that drive ``minirl.tasks.tool_calls`` directly)."""
    task, rng = PythonTool(digits), random.Random(seed)
    return [task.sample(rng) for _ in range(n)]


def reward(problem: Problem, trajectory_text: str) -> float:
    """rStar2-Agent Eq. 3: 1.0 for the right final answer, else 0.0."""
    return float(PythonTool().verify(problem, trajectory_text))
