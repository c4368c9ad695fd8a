"""Name -> function tables for the RL math, as verl's ``@register_policy_loss(name)`` /
``@register_adv_est(name)``: a ``TrainConfig`` switch (``correction``, ``loss``, ``advantage``) names
an entry, and the trainer makes one lookup instead of an if-chain.

Why a table: adding a correction used to touch five places (the function, the allowed names, the
fields, their ranges, the trainer's if-chain). Now it is the decorated function, plus its fields in
``minirl/training/train_config.py`` when it has new knobs: the config accepts the name, the trainer
calls it and the docs table lists it by reading the table.

Each entry names the ``TrainConfig`` fields it reads, ``@register_correction("icepop",
alpha="icepop_alpha", beta="icepop_beta")``: parameter ``alpha`` gets ``config.icepop_alpha``. The
function itself stays plain math on tensors and numbers, so its float64 reference test calls it
without a config.

A name is registered once: a second entry under a taken name is refused, never a silent
replacement (a setup module cannot swap the built-in ``icepop`` for its own). The fields an entry
reads are checked against the config when the config is built (``check_fields``), not at the
first step after the model loaded.

``import_extension`` imports a module a config names (``setup_modules``, a task's import path):
whatever that import does, an exception, ``sys.exit`` or a syntax error, comes back as one
``ValueError`` naming the config key and the module.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry:
    fn: Callable[..., Any]
    fields: dict[str, str]  # parameter -> the TrainConfig field it is read from
    params: frozenset[str]  # every parameter name of ``fn``


class Registry:
    """One switch's table: ``kind`` is the ``TrainConfig`` field that names an entry."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.entries: dict[str, Entry] = {}

    def register(self, name: str, **fields: str) -> Callable[[F], F]:
        """Decorator: ``fn`` is ``kind: name``; ``param="field"`` passes ``config.field`` as ``param``."""
        def add(fn: F) -> F:
            if name in self.entries:
                old = self.entries[name].fn
                raise ValueError(f"{self.kind} {name!r} is already registered ({old.__module__}.{old.__qualname__}); "
                                 f"pick another name")
            params = frozenset(inspect.signature(fn).parameters)
            if unknown := sorted(set(fields) - params):
                raise TypeError(f"{self.kind} {name!r}: {fn.__qualname__} has no parameter {', '.join(unknown)}")
            self.entries[name] = Entry(fn, dict(fields), params)
            return fn
        return add

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def call(self, name: str, config: Any, *args: Any, **inputs: Any) -> Any:
        """Entry ``name`` on ``args``, with its fields read off ``config`` and those ``inputs`` its
        signature names (a loss that needs no ``entropy_old`` does not declare it)."""
        entry = self.entries[name]
        own = {param: getattr(config, field) for param, field in entry.fields.items()}
        return entry.fn(*args, **{k: v for k, v in inputs.items() if k in entry.params}, **own)

    def check_fields(self, name: str, config: Any) -> None:
        """Refuse entry ``name`` when it reads a field ``config`` lacks: found when the config is
        built, not as an ``AttributeError`` at the first step after the model loaded. An
        unregistered ``name`` is left to the config check, which lists the registered ones."""
        entry = self.entries.get(name)
        if entry is None:
            return
        if missing := sorted(field for field in entry.fields.values() if not hasattr(config, field)):
            fn, owner = entry.fn, type(config).__name__
            raise ValueError(f"{self.kind} {name!r} ({fn.__module__}.{fn.__qualname__}) reads {owner} field "
                             f"{', '.join(missing)}, which {owner} does not have; register it with a field "
                             f"{owner} has, or declare the field in {owner}")

    def readers(self, field: str) -> list[str]:
        """The entries that read ``field`` (the docs table says which switch a knob belongs to)."""
        return [name for name, e in self.entries.items() if field in e.fields.values()]


def import_extension(name: object, key: str) -> ModuleType:
    """Module ``name``, which config ``key`` names (``setup_modules``, ``task 'mod:Class'``).

    Why everything is caught: the import runs a user's file, and a ``sys.exit(0)`` in it used to
    end ``mlab train`` with status 0 and no output, as if it had trained. A relative or empty name,
    a missing module, a syntax error, any exception and ``SystemExit`` become one ``ValueError``
    naming ``key`` and the module (chained to the cause, so a library caller keeps the
    traceback). Ctrl-C stays Ctrl-C."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{key}: {name!r} is not a module name; give an importable module, e.g. my_tasks")
    if name.startswith("."):
        raise ValueError(f"{key}: {name!r} is a relative module name; give an absolute one (package.module)")
    try:
        return importlib.import_module(name)
    except KeyboardInterrupt:
        raise
    except SyntaxError as e:
        where = f"{e.filename}, line {e.lineno}" if e.filename else f"line {e.lineno}"
        raise ValueError(f"{key}: {name!r} has a syntax error ({e.msg}, {where}); fix the module") from e
    except ImportError as e:
        raise ValueError(f"{key}: cannot import {name!r} ({e}); put its package on PYTHONPATH or install it "
                         f"(every Ray worker imports it too)") from e
    except SystemExit as e:
        code = "" if e.code is None else repr(e.code)
        raise ValueError(f"{key}: importing {name!r} called sys.exit({code}); a module a config names must only "
                         f"define (and register) things when imported") from e
    except BaseException as e:  # noqa: BLE001 - a user's module may raise anything; say which one did
        raise ValueError(f"{key}: importing {name!r} raised {type(e).__name__}: {e}; fix the module") from e
