"""Countdown / 24-game: combine the given numbers with + - * to hit a target, ``Q: 3 5 7 to 22 A: 3*5+7``."""

from __future__ import annotations

import ast
import random
from collections import Counter
from dataclasses import dataclass

from minirl.tasks.base import Problem, answer_text

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


@dataclass(frozen=True)
class Countdown:
    """``n_numbers`` numbers in [1, ``max_number``]; each must be used exactly once."""

    n_numbers: int = 3
    max_number: int = 9
    name: str = "countdown"

    def sample(self, rng: random.Random) -> Problem:
        while True:  # redraw until the target is >= 0 (a friendlier prompt)
            nums = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            expr = str(nums[0])
            for n in nums[1:]:
                expr += rng.choice("+-*") + str(n)
            target = evaluate(expr)
            if target >= 0:
                break
        shown = sorted(nums)
        return Problem(f"Q: {' '.join(map(str, shown))} to {target} A:", expr,
                       {"numbers": shown, "target": target})

    def verify(self, problem: Problem, completion: str) -> bool:
        text = answer_text(completion)
        try:
            value = evaluate(text)
        except ValueError:
            return False
        used = sorted(int(n.value) for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Constant))
        return value == problem.meta["target"] and Counter(used) == Counter(problem.meta["numbers"])


def evaluate(expr: str) -> int:
    """Value of an expression of non-negative integers, + - * and parentheses; anything else
    (names, calls, division, huge powers) is a ValueError, so model output is safe to check."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression: {expr!r}") from e
    if len(expr) > 64:
        raise ValueError("expression too long")

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported syntax in {expr!r}: {type(node).__name__}")

    return ev(tree)
