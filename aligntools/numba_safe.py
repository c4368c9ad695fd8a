"""numba, imported so that vLLM can still start an engine in the same process.

Why: when an ``LLM`` starts, vLLM's CPU platform rebinds its Triton kernels by scanning every
attribute of every module in ``sys.modules`` and reading ``vars(value).get("kernel")`` of each
one that has a ``__dict__`` (``vllm/triton_utils/dispatcher.py``, ``_rebind_kernels``).
llvmlite, numba's LLVM binding, keeps a module-level ``ffi.lib`` that answers *any* attribute
with a wrapped C function - ``__dict__`` included - so once numba is imported (aligntools'
compiled compare and stats kernels import it) every vLLM engine of the process fails with
"'_lib_fn_wrapper' object has no attribute 'get'". Giving ``lib`` a real (empty) ``__dict__``
entry in its function table makes the scan read nothing from it; llvmlite never looks a C
function up by that name.
"""

from __future__ import annotations

import sys

import numba  # noqa: F401  (re-exported: import numba from here)


def guard() -> None:
    """Make llvmlite's ``ffi.lib`` safe for vLLM's module scan (idempotent; a no-op when
    llvmlite is not loaded or no longer has the lazily filled function table)."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict) and not isinstance(table.get("__dict__"), dict):
        table["__dict__"] = {}  # replaces a C-function wrapper an earlier lookup may have cached


guard()
