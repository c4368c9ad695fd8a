"""Input validation shared by every op.

Why a module of its own: a mismatch experiment that silently broadcasts a wrong-shaped
weight or truncates an int64 position tensor produces *plausible* numbers, which is worse
than a crash. Every error names the tensor and its shape so the caller sees which argument
was wrong without reading the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_TRUSTED: ContextVar[bool] = ContextVar("kernels_trusted", default=False)


@contextmanager
def trusted() -> Iterator[None]:
    """Skip the argument checks of the ops called inside the block (results are unchanged).

    Why: a caller that has validated its tensors once (the minirl engine's decode loop calls
    the same ops on the same weights thousands of times) pays the Python checks on every
    call, and for decode-sized tensors they cost as much as the op. Only for callers that
    build the arguments themselves; user-facing code keeps the checks.
    """
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def skipped() -> bool:
    """True inside ``trusted()``: the op's ``check`` returns without validating."""
    return _TRUSTED.get()


def describe(name: str, t: torch.Tensor) -> str:
    """``name[2, 3] bfloat16 on cpu`` — the phrase every error message uses."""
    return f"{name}{list(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"


def floating(name: str, t: torch.Tensor) -> None:
    """Reject integer/bool tensors where the op needs real numbers."""
    if not torch.is_tensor(t):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{describe(name, t)}: expected a floating-point tensor")


def integer(name: str, t: torch.Tensor) -> None:
    """Reject float tensors used as indices (a float position silently truncates)."""
    if not torch.is_tensor(t):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{describe(name, t)}: expected an integer tensor")


def ndim(name: str, t: torch.Tensor, n: int, layout: str) -> None:
    """Require exactly ``n`` dims; ``layout`` spells the expected shape, e.g. ``[N, E]``."""
    if t.dim() != n:
        raise ValueError(f"{describe(name, t)}: expected {n} dims {layout}")


def same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {describe(name_a, a)} vs {describe(name_b, b)}")


def dim_matches(name_a: str, a: torch.Tensor, dim_a: int, name_b: str, b: torch.Tensor, dim_b: int) -> None:
    """``a.shape[dim_a] == b.shape[dim_b]``, with both tensors named on failure."""
    if a.shape[dim_a] != b.shape[dim_b]:
        raise ValueError(
            f"shape mismatch: {describe(name_a, a)} dim {dim_a} ({a.shape[dim_a]}) must equal "
            f"{describe(name_b, b)} dim {dim_b} ({b.shape[dim_b]})"
        )


def same_device(**tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        listing = ", ".join(describe(k, v) for k, v in tensors.items())
        raise ValueError(f"tensors on different devices: {listing}")


def positive(name: str, value: float) -> None:
    """eps, theta, temperature: a non-positive value is a configuration bug, never a default."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0, got {value!r}")


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """At least float32, float64 when any input is float64.

    The "math" precision of every reference: real inputs (bf16/fp16/fp32) are computed in
    fp32, and float64 inputs stay float64 so the same function doubles as the ground truth.
    """
    out = torch.float32
    for d in dtypes:
        out = torch.promote_types(out, d)
    return out
