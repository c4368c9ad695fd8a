"""Lazy loading of the Triton kernel modules.

Why lazy: ``import kernels`` must stay cheap and must work where triton is missing or
broken, because transformers imports our package while probing for Hugging Face's
``kernels`` hub package (see tests/kernels/test_not_hf_kernels_hub.py). Triton is only
imported the first time a Triton implementation runs.

Why the interpreter check: triton picks interpreter vs compiler when a ``@triton.jit``
function is *decorated*, reading ``TRITON_INTERPRET`` from the environment. On a CPU tensor a
compiled launch dies with "0 active drivers", so we refuse early with a message that says
what to do instead.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch


def interpreting() -> bool:
    """True when triton runs kernels through its numpy interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def load(module: str, *tensors: torch.Tensor) -> ModuleType:
    """Import ``kernels.<module>`` (which imports triton) after checking it can launch here."""
    on_cpu = any(t.device.type == "cpu" for t in tensors)
    if on_cpu and not interpreting():
        raise RuntimeError(
            "impl='triton' got CPU tensors but TRITON_INTERPRET=1 is not set; set it in the "
            "environment before triton is imported (slow, for tests), or use impl='torch' (or the "
            "default 'auto'), which computes the same numbers in plain torch"
        )
    try:
        return importlib.import_module(f"kernels.{module}")
    except ImportError as exc:  # triton missing: say what to use instead
        raise RuntimeError(f"triton is not importable ({exc}); use impl='torch' (same numerics)") from exc
