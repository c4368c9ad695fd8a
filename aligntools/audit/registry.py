"""The registry of semantic causes: one function per cause, looked up by name.

Why a registry (as verl's ``core_algos`` and minirl's ``@register_correction``): adding a cause is
one function and its test. A cause function takes the audit's ``Context`` and the current ``State``
and returns a ``Fit`` (its estimate and how to apply the cause to a state) or None when its signature
cannot apply (no candidate checkpoint, no routed experts, nothing to vary). The audit keeps the fit
that closes the most of the gap, and only if it closes at least ``ACCEPT`` of what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aligntools.audit.state import Context, State

ACCEPT = 0.5
"""A semantic cause is named only when applying it removes at least half of the remaining gap: a
semantic bug is systematic and explains most of the tokens it touches, while a parameter fitted to
numeric noise (T = 1.003) barely moves it."""


@dataclass(frozen=True)
class Fit:
    """A cause fitted to the records: ``estimate`` (T, p, k, a path...), ``parameter`` (what the
    estimate is, e.g. ``"T"``), ``apply`` ((context, state) -> the state with the cause at work, so a
    cause fitted on some records applies to all of them), ``fix`` (one sentence), ``detail``
    (cause-specific numbers)."""

    name: str
    estimate: float | int | str
    parameter: str
    apply: Callable[[Context, State], State]
    fix: str
    detail: dict = field(default_factory=dict)


CauseFn = Callable[[Context, State], "Fit | None"]
CAUSES: dict[str, CauseFn] = {}


def register_cause(name: str) -> Callable[[CauseFn], CauseFn]:
    """Register ``fn`` as the semantic cause ``name`` (tested in registration order)."""

    def add(fn: CauseFn) -> CauseFn:
        if name in CAUSES:
            raise ValueError(f"cause {name!r} is registered twice")
        CAUSES[name] = fn
        return fn

    return add
