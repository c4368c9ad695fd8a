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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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

    def readers(self, field: str) -> list[str]:
        """The entries that read ``field`` (the docs table says which switch a knob belongs to)."""
        return [name for name, e in self.entries.items() if field in e.fields.values()]
