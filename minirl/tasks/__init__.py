"""Verifiable tasks for RL: seeded generators and verifiers (reward = verifier result).

    >>> from minirl import tasks
    >>> train, held_out = tasks.splits(tasks.get("arithmetic"), n_train=1000, n_eval=64, seed=0)

``datasets/<task>_eval.jsonl`` are exported copies of the eval splits (``export``), for
reference; training always regenerates from the seed, so an installed package needs no files.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable

from minirl.algorithms.registry import import_extension
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
    named in ``TrainConfig.setup_modules``, which every mode imports before the config is checked).

    A taken name is refused, as in every registry (``minirl.algorithms.registry``): a setup module
    must not replace ``arithmetic`` unseen. The same definition registered again (same module and
    qualified name: its module imported anew, as a reload or a test's fresh import does) replaces
    its own entry."""
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise ValueError(f"task name {name!r}: give a non-empty name without ':' (a name with ':' is read as an "
                         f"import path)")
    old = _REGISTRY.get(name)
    if old is not None and _origin(old) != _origin(factory):
        raise ValueError(f"task {name!r} is already registered ({_origin(old)}); register "
                         f"{_origin(factory)} under another name")
    _REGISTRY[name] = factory


def _origin(factory: Callable[..., Task]) -> str:
    """``module.QualName`` of a factory: what tells a re-import of a definition from another one."""
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', type(factory).__qualname__)}"


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
    """The task class at import path ``module:Class``: importing the module may fail in any way
    (``import_extension`` names it); what it holds must be a task class (``sample`` and ``verify``),
    so ``builtins:dict`` is refused as what it is, not blamed on ``task_kwargs``."""
    module, _, attr = path.partition(":")
    where = f"task {path!r}"
    found = getattr(import_extension(module, where), attr, _MISSING) if attr else _MISSING
    if found is _MISSING:
        raise ValueError(f"{where}: cannot import it (AttributeError: module {module!r} has no {attr!r}); an "
                         f"import-path task is package.module:TaskClass, importable here (and in every Ray worker: "
                         f"on PYTHONPATH or installed)")
    if not (isinstance(found, type) and all(callable(getattr(found, m, None)) for m in ("sample", "verify"))):
        what = "class" if isinstance(found, type) else type(found).__name__
        raise ValueError(f"{where}: not a task ({attr} is a {what} without sample and verify); a task is a class with "
                         f"sample(rng) and verify(problem, completion) (docs/rl.md, \"Adding a task\")")
    return found


_MISSING = object()


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
