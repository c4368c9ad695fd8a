"""Variant registry: a variant names *numerics*; the device picks the implementation.

Every op has named variants that real engines use (``variants(op)``); each variant has a
plain-torch implementation and may have a Triton one that computes the same numbers (tested
equal through the interpreter). ``get(op, name)`` returns a callable that runs the Triton
implementation when its first tensor argument is on CUDA and triton imports, the torch one
otherwise: switching device never switches numerics beyond reduction order, and a knob or a
Replayer setting names what is computed, never where. ``impl="torch"|"triton"`` forces one
(the interpreter tests run Triton on CPU tensors; the benchmarks time both).

Each registered torch function's docstring says who computes it that way and why it differs
from the reference.
"""

from __future__ import annotations

import functools
from typing import Callable

IMPLS = ("torch", "triton")

_REGISTRY: dict[str, dict[str, dict[str, Callable]]] = {}  # op -> variant -> impl -> callable


def register(op: str, name: str, impl: str = "torch") -> Callable[[Callable], Callable]:
    """Decorator: ``@register("rmsnorm", "hf")``; ``impl="triton"`` adds the Triton implementation
    of an already registered variant (it must compute the torch one's numbers)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")

    def deco(fn: Callable) -> Callable:
        if not fn.__doc__:
            raise TypeError(f"kernel variant {op}/{name} ({impl}) needs a docstring saying who does it this way")
        if impl == "triton" and name not in _REGISTRY.get(op, {}):
            raise KeyError(f"register the torch implementation of {op}/{name} before its Triton one")
        _REGISTRY.setdefault(op, {}).setdefault(name, {})[impl] = fn
        return fn

    return deco


def ops() -> list[str]:
    """Names of the registered ops."""
    return sorted(_REGISTRY)


def variants(op: str) -> list[str]:
    """Variant names (numerics) of ``op``."""
    return sorted(_table(op))


def impls(op: str, name: str) -> list[str]:
    """Implementations of variant ``name``: ``["torch"]`` or ``["torch", "triton"]``."""
    return [i for i in IMPLS if i in _entry(op, name)]


def get(op: str, name: str, impl: str = "auto") -> Callable:
    """The callable of variant ``name`` of ``op``.

    ``impl="auto"``: Triton on CUDA tensors when the variant has a Triton implementation and
    triton imports, torch otherwise (a variant without a Triton implementation returns its
    torch function itself, so CPU callers pay nothing). ``"torch"`` / ``"triton"`` force one;
    a forced Triton on CPU tensors needs ``TRITON_INTERPRET=1``.
    """
    entry = _entry(op, name)
    if impl == "auto":
        if "triton" not in entry:
            return entry["torch"]
        return _auto(entry["torch"], entry["triton"])
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'auto' or one of {IMPLS}, got {impl!r}")
    if impl not in entry:
        raise KeyError(f"{op} variant {name!r} has no {impl} implementation; it has {impls(op, name)}")
    return entry[impl]


def _auto(torch_fn: Callable, triton_fn: Callable) -> Callable:
    """Dispatch on the first argument's device (every op's first argument is its main tensor)."""

    @functools.wraps(torch_fn)
    def run(first, *args, **kwargs):
        fn = triton_fn if first.is_cuda and triton_available() else torch_fn
        return fn(first, *args, **kwargs)

    return run


@functools.cache
def triton_available() -> bool:
    """Whether triton imports here (asked once, on the first CUDA call)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _table(op: str) -> dict[str, dict[str, Callable]]:
    table = _REGISTRY.get(op)
    if table is None:
        raise KeyError(f"unknown kernel op {op!r}; known ops: {ops()}")
    return table


def _entry(op: str, name: str) -> dict[str, Callable]:
    table = _table(op)
    if name not in table:
        raise KeyError(f"unknown {op} variant {name!r}; variants: {sorted(table)}")
    return table[name]
