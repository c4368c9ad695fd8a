"""Every ``TrainConfig`` value checked in one place, before a model loads.

Why: a YAML slip (``steps: ten``, ``progress: 'no'``, ``betas: [0.9]``) or a value that makes no
sense (``n_eval: -5``, ``grad_clip: .nan``) used to pass the config and fail far away, as a bare
TypeError deep in torch, or worse, train something else silently. Here:

* the **type** of each field comes from the dataclass annotation (``int``, ``float``, ``bool``,
  ``str``, ``dict``, ``list[X]``, ``tuple[X, Y]``, ``X | None``, ``Literal``), so a new field is
  checked with no new code;
* the **range** of a numeric field, the **values** of a switch and **non-empty** strings are
  declared beside the field (``ranged``, ``one_of``, ``non_empty``: ``dataclasses.field`` metadata);
* the task's own options (``task_kwargs``) are checked by building the task and sampling one problem.

Every error names the key, the value, what is valid and the fix. Conversions are the lossless
ones only: an int for a float field, a list for a tuple, a ``pathlib.Path`` for a string, and a
number YAML left as a string (YAML 1.1 reads ``1e-3`` without a dot as the string ``'1e-3'``).

Why not pydantic (installed, but not a dependency): its lax mode converts what this refuses
(``'no'`` -> False, ``2.0`` -> 2, ``'10'`` -> 10) and its strict mode refuses the lossless conversions
above; keeping these messages would take a validator per type plus a translation of its errors,
more code than ``_conform``, and 0.3 s more import.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import reprlib
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """Valid values of a number (each element, for a tuple field): ``low``..``high``, each bound
    included unless ``*_open``; ``finite`` also refuses +-inf. NaN is refused for every field
    (``Range()``, the range of a field that declares none, admits every other number)."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    finite: bool = False
    why: str = ""

    def contains(self, v: float) -> bool:
        if self.finite and isinstance(v, float) and not math.isfinite(v):
            return False
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def describe(self) -> str:
        bounds = []
        if self.low > -math.inf:
            bounds.append(f"{'>' if self.low_open else '>='} {_bound(self.low)}")
        if self.high < math.inf:
            bounds.append(f"{'<' if self.high_open else '<='} {_bound(self.high)}")
        if self.finite:
            bounds.append("finite")
        return " and ".join(bounds)


def _bound(x: float) -> str:
    """``1000000``, not ``1e+06``: a bound reads as the number to type."""
    if isinstance(x, int):
        return str(x)
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def ranged(default: Any, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = False, finite: bool = False, why: str = "") -> Any:
    """A dataclass field that declares its valid range beside itself, ``steps: int = ranged(10, 1)``
    (``Range``'s arguments; ``why`` is said in the error and the docs table)."""
    return dataclasses.field(default=default, metadata={"range": Range(low, high, low_open, high_open, finite, why)})


def one_of(default: str, valid: Iterable[str]) -> Any:
    """A field naming one of ``valid``: a tuple, or a registry (``minirl.algorithms.registry``),
    read when a config is checked, so an entry registered after this class is defined counts."""
    return dataclasses.field(default=default, metadata={"one_of": valid})


def non_empty(default: str, why: str, what: str, separator: str | None = None) -> Any:
    """A string field that must not be blank, why, and ``what`` to set it to instead; with
    ``separator``, a list in one string (``'a,b'``), blank when no item is (``',,,'``)."""
    return dataclasses.field(default=default, metadata={"non_empty": (why, what), "separator": separator})


def check(config: object) -> None:
    """Check (and losslessly convert in place) every field of the dataclass ``config``: type from
    its annotation, then what its metadata declares (range, values, non-empty); then its task
    options. Raises ``ValueError``."""
    hints = _hints(type(config))
    for f in dataclasses.fields(config):
        value = conform(f.name, getattr(config, f.name), hints[f.name], f)
        object.__setattr__(config, f.name, value)
        _check_range(f.name, value, f.metadata.get("range", Range()))
        if "one_of" in f.metadata and value not in f.metadata["one_of"]:
            valid = ", ".join(f.metadata["one_of"])
            raise ValueError(f"{f.name}={short(value)}; valid: {valid}; set {f.name} to one of them")
        if "non_empty" in f.metadata and not any(
                item.strip() for item in str(value).split(f.metadata["separator"] or None)):
            why, what = f.metadata["non_empty"]
            raise ValueError(f"{f.name}={value!r}: must not be empty ({why}); set {f.name} to {what}")
    if hasattr(config, "task") and hasattr(config, "task_kwargs"):
        check_task(config.task, config.task_kwargs)


def conform(name: str, value: object, tp: object, f: dataclasses.Field | None = None) -> object:
    """``value`` as annotation ``tp`` wants it, or a ValueError naming ``name``, the value, the
    expected type and the fix (an example: the field's default)."""
    try:
        return _conform(value, tp)
    except _Mismatch:
        pass
    example = ""
    if f is not None and f.default is not dataclasses.MISSING and f.default not in ("", None):
        example = f", e.g. {name}: {_yaml(f.default)} (the default)"
    got = "null" if value is None else f"{short(value)} ({type(value).__name__})"
    raise ValueError(f"{name}={got}: expected {describe(tp)}; set {name} to {describe(tp)}{example}")


def describe(tp: object) -> str:
    """Words for an annotation, as an error message shows it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        words = [describe(a) for a in args if a is not type(None)]
        return " or ".join(words) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} values, each {' / '.join(sorted({describe(a) for a in args}))}"
    if origin in (list, tuple):
        return f"a list (each {describe(args[0])})" if args else "a list"
    if tp is dict or origin is dict:
        return "a mapping (key: value)"
    return {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}.get(tp, str(tp))


def check_task(task: str, task_kwargs: dict) -> None:
    """Build the task with ``task_kwargs`` and sample one problem: the task's own check of its
    options, so ``digits: -1`` fails here naming ``task_kwargs`` rather than inside ``random``."""
    from minirl.tasks import factory

    make = factory(task)
    if "name" in task_kwargs:  # every task class has a `name` field, which would take it and rename the task
        raise ValueError(f"task_kwargs.name={short(task_kwargs['name'])}: `name` is not a task option (the task is "
                         f"named by the `task` key, here {task!r}); remove it from task_kwargs")
    _check_task_options(make, task_kwargs)
    try:
        built = make(**task_kwargs)
    except TypeError as e:
        raise ValueError(f"task_kwargs={short(task_kwargs)}: task {task!r} does not take these options ({e}); fix "
                         f"task_kwargs to the options of task {task!r} (each task's class in minirl.tasks lists "
                         f"them)") from None
    if not all(callable(getattr(built, m, None)) for m in ("sample", "verify")):
        raise ValueError(f"task {task!r} built a {type(built).__name__}, not a task (no sample and verify); a task "
                         f"has sample(rng) and verify(problem, completion) (docs/rl.md, \"Adding a task\")")
    try:
        built.sample(random.Random(0))
    except Exception as e:  # noqa: BLE001 - whatever the task raises, the options are the cause
        raise ValueError(f"task_kwargs={short(task_kwargs)} do not make a valid {task!r} task: sampling a problem "
                         f"fails with {type(e).__name__}: {e}; fix task_kwargs") from None


def _check_task_options(make: object, task_kwargs: dict) -> None:
    """Each option the task's signature annotates as a plain type (bool, int, float, str), checked
    as a config field is: ``digits: true`` is not a whole number, though Python would take it as 1."""
    try:
        hints = typing.get_type_hints(make.__init__ if isinstance(make, type) else make)
    except Exception:  # noqa: BLE001 - annotations that do not resolve leave the options to the task
        return
    for key, value in task_kwargs.items():
        if hints.get(key) in (bool, int, float, str):
            conform(f"task_kwargs.{key}", value, hints[key])


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, object]:
    """The class's resolved annotations (``from __future__ import annotations`` leaves strings)."""
    return typing.get_type_hints(cls)


class _Mismatch(Exception):
    """``value`` does not fit the annotation (internal: ``conform`` turns it into the message)."""


def _conform(value: object, tp: object) -> object:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return _conform(value, a)
                except _Mismatch:
                    continue
        raise _Mismatch
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        return _number(value)
    if tp is str:
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
        raise _Mismatch
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        if args:
            return {_conform(k, args[0]): _conform(v, args[1]) for k, v in value.items()}
        return value
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _Mismatch
            return tuple(_conform(v, a) for v, a in zip(value, args))
        items = [_conform(v, args[0]) for v in value] if args else list(value)
        return tuple(items) if (origin or tp) is tuple else items
    raise TypeError(f"config_check does not know the annotation {tp!r}; teach _conform/describe this type")


def _number(value: object) -> float:
    if isinstance(value, bool):
        raise _Mismatch
    if isinstance(value, int) and abs(value) > _FLOAT_MAX:  # as YAML reads 1e400: inf, which ranges refuse
        return math.inf if value > 0 else -math.inf
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 leaves 1e-3 (no dot) a string
        try:
            return float(value)
        except ValueError:
            raise _Mismatch from None
    raise _Mismatch


INT64 = 2**63 - 1
"""The largest whole number a field may hold: the run's logs and checkpoints store them as int64."""
_FLOAT_MAX = sys.float_info.max


def _check_range(name: str, value: object, valid: Range) -> None:
    many = isinstance(value, (tuple, list))
    for v in value if many else (value,):
        if isinstance(v, int) and not isinstance(v, bool) and not -INT64 - 1 <= v <= INT64:
            valid = dataclasses.replace(valid, low=max(valid.low, -INT64 - 1), high=min(valid.high, INT64))
        if isinstance(v, (int, float)) and ((isinstance(v, float) and math.isnan(v)) or not valid.contains(v)):
            rule = valid.describe()
            why = f" ({valid.why})" if valid.why else ""
            if not rule:
                raise ValueError(f"{name}={_yaml(value)}: NaN is not a setting; set {name} to a number")
            raise ValueError(f"{name}={_yaml(value)}: {'each value ' if many else ''}must be {rule}{why}; "
                             f"set {name} to {'values' if many else 'a value'} {rule}")


def short(value: object) -> str:
    """``repr(value)`` capped (``reprlib``): a message echoes what it refuses, and a refused value
    may be a megabyte-long list or a 10**30 integer."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 8
_SHORT.maxlevel = 3


def _yaml(value: object) -> str:
    """A value as it would be written in the YAML config (lists as [a, b], None as null), capped
    like ``short``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        more = ", ..." if len(value) > _SHORT.maxlist else ""
        return "[" + ", ".join(_yaml(v) for v in value[:_SHORT.maxlist]) + more + "]"
    if isinstance(value, float) and math.isnan(value):
        return ".nan"
    return short(value)
