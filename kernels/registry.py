"""Variant registry: every op has named implementations that real engines use.

``variants(op)`` lists names, ``get(op, name)`` returns the callable. Each registered
function's docstring says who computes it that way and why it differs from the reference.
"""

from __future__ import annotations

from typing import Callable

_REGISTRY: dict[str, dict[str, Callable]] = {}


def register(op: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: ``@register("rmsnorm", "hf")``."""

    def deco(fn: Callable) -> Callable:
        if not fn.__doc__:
            raise TypeError(f"kernel variant {op}/{name} needs a docstring saying who does it this way")
        _REGISTRY.setdefault(op, {})[name] = fn
        return fn

    return deco


def ops() -> list[str]:
    """Names of the registered ops."""
    return sorted(_REGISTRY)


def variants(op: str) -> list[str]:
    """Variant names of ``op``."""
    if op not in _REGISTRY:
        raise KeyError(f"unknown kernel op {op!r}; known ops: {ops()}")
    return sorted(_REGISTRY[op])


def get(op: str, name: str) -> Callable:
    """The callable of variant ``name`` of ``op``."""
    table = _REGISTRY.get(op)
    if table is None:
        raise KeyError(f"unknown kernel op {op!r}; known ops: {ops()}")
    if name not in table:
        raise KeyError(f"unknown {op} variant {name!r}; variants: {sorted(table)}")
    return table[name]
