"""PEP 562 front doors: a package's public names imported on first use.

Why: ``mlab --help``, ``mlab zoo list`` and a Ray actor of the transfer queue need none of torch,
transformers or matplotlib, yet ``import aligntools.cli.check`` runs ``aligntools/__init__.py`` first;
eager re-exports there made every ``mlab`` command pay ~6 s of imports before reading its arguments.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def exports(package: str, names: dict[str, str], namespace: dict) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``names`` map to the module defining each
    (a name mapped to itself is a submodule, returned as the module). Any other subpackage is imported
    when first read as an attribute too (``import aligntools; aligntools.gates.inputs``), as the eager
    imports used to leave it. A looked-up value is stored in the package's ``namespace``, so the next
    lookup is a plain attribute."""

    def getattr_(name: str) -> object:
        target = names.get(name, f"{package}.{name}")
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            if name in names or e.name != target:
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = module if target == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *names})

    return getattr_, dir_
