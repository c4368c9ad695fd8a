"""Which variant to run where: the Triton kernel on CUDA, its plain-torch twin elsewhere.

Each Triton kernel has exactly one torch variant with the same semantics (``TORCH_TWIN``).
On CPU the twin is used because the Triton interpreter is orders of magnitude slower; the
tests hold the pair to the same numbers, so switching device never switches numerics beyond
reduction order.
"""

from __future__ import annotations

from typing import Callable

import torch

from .registry import get

#: op -> the torch variant that computes what that op's ``triton`` variant computes.
TORCH_TWIN: dict[str, str] = {
    "rmsnorm": "reference",
    "rope": "fp32_compute",
    "router_topk": "stable",
    "logprobs": "chunked",
}


def fast_variant(op: str, device: torch.device | str) -> str:
    """``"triton"`` on CUDA when triton imports, else the op's torch twin."""
    if op not in TORCH_TWIN:
        raise KeyError(f"no triton kernel for op {op!r}; ops with one: {sorted(TORCH_TWIN)}")
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return TORCH_TWIN[op]
        return "triton"
    return TORCH_TWIN[op]


def fast(op: str, device: torch.device | str) -> Callable:
    """The callable ``fast_variant(op, device)`` names."""
    return get(op, fast_variant(op, device))
