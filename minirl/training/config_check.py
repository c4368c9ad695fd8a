"""Every ``TrainConfig`` value checked in one place, before a model loads.

Why: a YAML slip (``steps: ten``, ``progress: 'no'``, ``betas: [0.9]``) or a value that makes no
sense (``n_eval: -5``, ``grad_clip: .nan``) used to pass the config and fail far away, as a bare
TypeError deep in torch, or worse, train something else silently. Here:

* the **type** of each field comes from the dataclass annotation (``int``, ``float``, ``bool``,
  ``str``, ``dict``, ``list[X]``, ``tuple[X, Y]``, ``X | None``, ``Literal``), so a new field is
  checked with no new code;
* the **range** of a numeric field comes from ``RANGES`` (one line per field);
* the task's own options (``task_kwargs``) are checked by building the task and sampling one problem.

Every error names the key, the value, what is valid and the fix. Conversions are the lossless
ones only: an int for a float field, a list for a tuple, a ``pathlib.Path`` for a string, and a
number YAML left as a string (YAML 1.1 reads ``1e-3`` without a dot as the string ``'1e-3'``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import reprlib
import types
import typing
from dataclasses import dataclass

from minirl.sandbox.runner import MAX_TIMEOUT_S


@dataclass(frozen=True)
class Range:
    """Valid values of a number (each element, for a tuple field): ``low``..``high``, each bound
    included unless ``*_open``; ``finite`` also refuses +-inf. NaN is refused for every field
    (``Range()``, the range of a field not in ``RANGES``, admits every other number)."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    finite: bool = False
    why: str = ""

    def contains(self, v: float) -> bool:
        if self.finite and not math.isfinite(v):
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
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


_COUNT = Range(1)
_PROBLEMS = ("the problems are drawn up front, about 20 us each, before the first step: a million is "
             "20 s; more only hangs the start")
MAX_SAMPLES_PER_STEP = 1 << 20
"""prompts_per_step * group_size: one step's rollouts, generated and held as one batch."""
RANGES: dict[str, Range] = {
    "sft_steps": Range(0, why="0 starts RL from `model` as is"),
    "n_train": Range(1, 1_000_000, why=_PROBLEMS),
    "n_eval": Range(0, 1_000_000, why=f"held-out problems; 0 = no held-out evaluation; {_PROBLEMS}"),
    "seed": Range(0, 2**63 - 1),
    "prompts_per_step": Range(1, 65_536, why="each step rolls out every prompt as one batch"),
    "group_size": Range(2, 4096, why="GRPO needs >= 2 samples per prompt: with 1, every advantage is 0 and nothing "
                                     "is learned; each sample of a group is held in one step's batch"),
    "max_new_tokens": Range(1, 1 << 20, why="a completion's token budget, past any context length here"),
    "temperature": Range(0.01, finite=True,
                         why="0 is greedy decoding: every sample of a group is the same, so every advantage "
                             "is 0 and nothing is learned; below 0.01 a logit gap of 1 becomes e^-100, zero in "
                             "float32, so sampling is greedy in effect"),
    "eps_low": Range(0, 1, high_open=True, why="the ratio is clipped below at 1 - eps_low, which must stay > 0"),
    "eps_high": Range(0, finite=True),
    "dual_clip": Range(1, low_open=True, finite=True, why="dual-clip c > 1 (Ye et al. 2020 §3.2); null disables"),
    "gspo_eps_low": Range(0, 1, high_open=True),
    "gspo_eps_high": Range(0, finite=True),
    "kl_coef": Range(0, finite=True, why="a negative coefficient rewards moving away from the reference"),
    "icepop_alpha": Range(0, finite=True),
    "icepop_beta": Range(0, low_open=True),
    "tis_cap": Range(0, low_open=True),
    "mis_low": Range(0, finite=True),
    "mis_high": Range(0, low_open=True),
    "lr": Range(0, low_open=True, finite=True),
    "weight_decay": Range(0, finite=True),
    "betas": Range(0, 1, high_open=True, why="AdamW's two decay rates, each in [0, 1)"),
    "grad_clip": Range(0, low_open=True, finite=True,
                       why="the gradient norm is clipped to it; NaN would make every weight NaN and a "
                           "negative value reverses every update"),
    "minibatches": _COUNT,
    "epochs": Range(1, 1000, why="passes over each step's batch; past a few the policy only overfits that batch"),
    "steps": _COUNT,
    "eval_every": Range(0, why="0 = never evaluate"),
    "checkpoint_every": Range(0, why="0 = never write a checkpoint (the run cannot be resumed)"),
    "max_nan_steps": _COUNT,
    # the algorithm switches' options (minirl.training.combinations checks how the switches combine)
    "espo_top_fraction": Range(0, 1),
    "espo_n_groups": _COUNT,
    "espo_alpha": Range(0, low_open=True, finite=True),
    "espo_clip_eps": Range(0, low_open=True, finite=True),
    "zero_variance_max_batches": _COUNT,
    "zero_variance_alpha": Range(0, finite=True),
    "adaptive_group_max": Range(2),
    "c3po_token_budget": _COUNT,
    "c3po_retention": _COUNT,
    "c3po_chunk_tokens": _COUNT,
    "c3po_pool_capacity": Range(0, why="0 = one synchronous step's rollouts, prompts_per_step * group_size"),
    "tool_max_turns": _COUNT,
    "tool_timeout_s": Range(0, MAX_TIMEOUT_S, low_open=True,
                            why="the sandbox's limit for one tool call; longer is a stuck rollout"),
    "max_staleness": Range(0, why="0 = synchronous, 1 = AsyncFlow's one-step-off update"),
    "reward_timeout_s": Range(0, low_open=True),
    "sample_timeout_s": Range(0, low_open=True),
    "queue_capacity": _COUNT,
    "ray_num_cpus": _COUNT,
    "rollout_actors": _COUNT,
    "cpus_per_actor": Range(0, low_open=True, finite=True),
    "connect_timeout_s": Range(0, low_open=True),
    "draft_tokens": _COUNT,
}


NON_EMPTY = {"out_dir": "'' would write the run's files into the current directory"}
"""String fields that must not be empty, and why."""


def check(config: object) -> None:
    """Check (and losslessly convert in place) every field of the dataclass ``config``: type from
    its annotation, range from ``RANGES``, non-empty where ``NON_EMPTY`` says; then its task
    options. Raises ``ValueError``."""
    hints = _hints(type(config))
    for f in dataclasses.fields(config):
        value = conform(f.name, getattr(config, f.name), hints[f.name], f)
        object.__setattr__(config, f.name, value)
        _check_range(f.name, value, RANGES.get(f.name, Range()))
        if f.name in NON_EMPTY and not str(value).strip():
            raise ValueError(f"{f.name}={value!r}: must not be empty ({NON_EMPTY[f.name]}); set {f.name} to a "
                             f"directory path")
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
    from minirl.tasks import get as get_task

    try:
        built = get_task(task, **task_kwargs)
    except TypeError as e:
        raise ValueError(f"task_kwargs={short(task_kwargs)}: task {task!r} does not take these options ({e}); fix "
                         f"task_kwargs to the options of task {task!r} (each task's class in minirl.tasks lists "
                         f"them)") from None
    try:
        built.sample(random.Random(0))
    except Exception as e:  # noqa: BLE001 - whatever the task raises, the options are the cause
        raise ValueError(f"task_kwargs={short(task_kwargs)} do not make a valid {task!r} task: sampling a problem "
                         f"fails with {type(e).__name__}: {e}; fix task_kwargs") from None


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
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 leaves 1e-3 (no dot) a string
        try:
            return float(value)
        except ValueError:
            raise _Mismatch from None
    raise _Mismatch


def _check_range(name: str, value: object, valid: Range) -> None:
    many = isinstance(value, (tuple, list))
    for v in value if many else (value,):
        if isinstance(v, (int, float)) and (math.isnan(v) or not valid.contains(v)):
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
