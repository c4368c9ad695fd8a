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

import numba  # noqa: F401  (re-exported: import numba from here)

from kernels.llvmlite_guard import guard

guard()
