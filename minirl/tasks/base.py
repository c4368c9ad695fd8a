"""What a task is: seeded problem generation plus a verifier that scores a completion."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer. ``meta`` holds what the verifier needs."""

    prompt: str  # e.g. "Q: 12+7= A:" (the format the zoo models saw in pre-training)
    answer: str  # a correct completion, e.g. "19" (SFT warm-up traces, exports)
    meta: dict = field(default_factory=dict)


class Task(Protocol):
    """A task generates problems from a ``random.Random`` and verifies completions.

    ``verify`` is the reward: a bool, or a float for partial credit (e.g. 0.5 for the right
    format with a wrong answer). A task with partial credit also defines ``correct(problem,
    completion) -> bool``, exact correctness, which held-out accuracy counts (``is_correct``);
    without it a completion is correct when its reward is 1."""

    name: str

    def sample(self, rng: random.Random) -> Problem: ...

    def verify(self, problem: Problem, completion: str) -> bool | float: ...


def is_correct(task: Task, problem: Problem, completion: str) -> bool:
    """Exact correctness as ``task`` defines it (its ``correct``), else reward == 1: partial
    credit never counts as solved."""
    correct = getattr(task, "correct", None)
    if correct is not None:
        return bool(correct(problem, completion))
    return float(task.verify(problem, completion)) == 1.0


def answer_text(completion: str) -> str:
    """The answer part of a completion: up to the first newline, stripped."""
    return completion.split("\n", 1)[0].strip()


def splits(task: Task, n_train: int, n_eval: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Deterministic, disjoint (by prompt) train and held-out eval problems from ``seed``.

    The eval split is drawn first so that growing ``n_train`` never changes it."""
    if n_train < 1:
        raise ValueError(f"n_train={n_train}: the training set is empty; set n_train >= 1")
    rng, seen = random.Random(seed), set()
    out: list[Problem] = []
    tries = 0
    while len(out) < n_eval + n_train:
        p = task.sample(rng)
        tries += 1
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
        elif tries > 50 * (n_eval + n_train):
            raise ValueError(f"task {task.name!r} has fewer than {n_eval + n_train} distinct problems; "
                             f"lower n_train/n_eval or make the task harder")
    return out[n_eval:], out[:n_eval]
