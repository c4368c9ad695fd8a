"""Verifiable tasks for RL: seeded generators and verifiers (reward = verifier result).

    >>> from minirl import tasks
    >>> train, held_out = tasks.splits(tasks.get("arithmetic"), n_train=1000, n_eval=64, seed=0)

``datasets/<task>_eval.jsonl`` are exported copies of the eval splits (``export``), for
reference; training always regenerates from the seed, so an installed package needs no files.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
from collections.abc import Callable

from minirl.tasks.arithmetic import Arithmetic
from minirl.tasks.base import Problem, Task, answer_text, is_correct, splits
from minirl.tasks.chat_arithmetic import ChatArithmetic
from minirl.tasks.countdown import Countdown
from minirl.tasks.longtail_sorting import LongTailSorting
from minirl.tasks.python_tool import PythonTool
from minirl.tasks.sorting import Sorting

_REGISTRY: dict[str, Callable[..., Task]] = {"arithmetic": Arithmetic, "countdown": Countdown, "sorting": Sorting,
                                               "longtail_sorting": LongTailSorting, "python_tool": PythonTool}
_REGISTRY["chat_arithmetic"] = ChatArithmetic  # for instruct models: asked in words, answered in a sentence


def register(name: str, factory: Callable[..., Task]) -> None:
    """Make ``factory(**task_kwargs)`` available as ``TrainConfig.task = name`` (from a module
    named in ``TrainConfig.setup_modules``, which every mode imports before the config is checked)."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str, **kwargs) -> Task:
    """The task called ``name``, built with ``kwargs`` (e.g. ``digits=3``): a registered name, or
    an import path ``package.module:Factory`` (a researcher's task, no registration needed)."""
    return factory(name)(**kwargs)


def factory(name: str) -> Callable[..., Task]:
    """What builds task ``name`` (``get``); an unknown name fails naming the valid ones."""
    if ":" in name:
        return _imported(name)
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown task {name!r}{hint}; valid: {', '.join(names())}, a name a setup_modules module "
                         f"registers (minirl.tasks.register), or an import path package.module:TaskClass")
    return _REGISTRY[name]


def uses_tools(name: str) -> bool:
    """Whether task ``name`` is solved multi-turn with tool calls (known before it is built, so a
    config can be checked without one); an unknown name is left to ``get`` to report."""
    try:
        return bool(getattr(factory(name), "uses_tools", False))
    except ValueError:
        return False


def _imported(path: str) -> Callable[..., Task]:
    module, _, attr = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"task {path!r}: cannot import it ({type(e).__name__}: {e}); an import-path task is "
                         f"package.module:TaskClass, importable here (and in every Ray worker: on PYTHONPATH "
                         f"or installed)") from None
    if not callable(found):
        raise ValueError(f"task {path!r}: {attr} is a {type(found).__name__}, not a class or factory")
    return found


def export(problems: list[Problem], path: str | os.PathLike) -> None:
    """Write problems as jsonl (prompt, answer, meta), one per line."""
    with open(path, "w") as f:
        for p in problems:
            f.write(json.dumps({"prompt": p.prompt, "answer": p.answer, "meta": p.meta}) + "\n")


def load(path: str | os.PathLike) -> list[Problem]:
    """Read problems written by ``export``."""
    with open(path) as f:
        return [Problem(**json.loads(line)) for line in f if line.strip()]


__all__ = ["Arithmetic", "Countdown", "Problem", "PythonTool", "Sorting", "Task", "answer_text", "export", "factory",
           "get", "is_correct", "load", "names", "register", "splits", "uses_tools"]
