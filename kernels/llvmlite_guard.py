"""Keep llvmlite's ``ffi.lib`` out of vLLM's start-up scan of every module.

Why here, at the bottom layer: aligntools imports numba (its compiled compare and stats
kernels) and must guard at once, so that a ``vllm.LLM`` the user starts later works; minirl's
vLLM engine guards again before it starts one, for numba loaded by anyone else. Details:
``aligntools.numba_vllm_compat``.
"""

from __future__ import annotations

import sys


def guard() -> None:
    """Make llvmlite's ``ffi.lib`` safe for vLLM's module scan (idempotent; a no-op when
    llvmlite is not loaded or no longer has the lazily filled function table)."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict) and not isinstance(table.get("__dict__"), dict):
        table["__dict__"] = {}  # replaces a C-function wrapper an earlier lookup may have cached

