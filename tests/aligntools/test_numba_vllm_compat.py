"""numba in the process must not break vLLM's start-up scan of every module.

vLLM (``triton_utils/dispatcher.py``, ``_rebind_kernels``) reads ``vars(value).get("kernel")``
of every module attribute that has a ``__dict__``; llvmlite's ``ffi.lib`` answered that with a
C-function wrapper, so every vLLM engine started after aligntools' compiled kernels had loaded
numba crashed. The real engine runs in tests/vllm; this is the scan itself, on CPU, without vLLM.
"""

from __future__ import annotations

import sys

import pytest

from aligntools.numba_vllm_compat import guard

# the scan touches every module attribute, as vLLM's does, deprecated ones (torch.distributed.reduce_op) too
pytestmark = pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning")


def vllm_style_scan() -> int:
    """The part of vLLM's scan that crashed; returns how many namespaces it read."""
    read = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for value in list(namespace.values()):
            if hasattr(value, "__dict__"):
                vars(value).get("kernel")
                read += 1
    return read


def test_module_scan_survives_numba():
    import llvmlite.binding.ffi as ffi

    assert "__dict__" in ffi.lib._fntab  # the guard ran when aligntools imported numba
    assert vllm_style_scan() > 0


def test_guard_is_what_makes_the_scan_pass(monkeypatch):
    import llvmlite.binding.ffi as ffi

    monkeypatch.delitem(ffi.lib._fntab, "__dict__")
    try:
        vllm_style_scan()
        raise AssertionError("the scan should fail on llvmlite's ffi.lib without the guard")
    except AttributeError as e:
        assert "'get'" in str(e)
    guard()
    guard()  # idempotent
    assert vllm_style_scan() > 0
