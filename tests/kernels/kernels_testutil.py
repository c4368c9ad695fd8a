"""Helpers for the kernel tests: error measures against float64 truth, ulp arithmetic."""

from __future__ import annotations

from typing import Callable

import torch

import kernels


def ulp(dtype: torch.dtype) -> float:
    """Spacing of ``dtype`` numbers in [1, 2): 2**-7 for bf16, 2**-23 for fp32."""
    return torch.finfo(dtype).eps


def max_ulps(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, floor_rel: float = 0.0) -> float:
    """Largest |a - b| in units of ``dtype``'s ulp at the magnitude of ``b`` (>= 1 tiny).

    ``floor_rel`` > 0 measures values smaller than ``floor_rel * max|b|`` at that floor instead:
    where an output cancels to ~0 (a RoPE rotation, a residual sum) its own ulp is denormal-small and
    the ratio says nothing about the kernel (a 5e-7 difference at an exact 0 read as 7e36 ulps on an H100)."""
    a, b = a.double(), b.double()
    scale = b.abs().clamp_min(max(torch.finfo(dtype).tiny, floor_rel * float(b.abs().max())))
    ulp_at = torch.exp2(torch.floor(torch.log2(scale))) * ulp(dtype)
    return float(((a - b).abs() / ulp_at).max())


def mean_abs_err(a: torch.Tensor, truth: torch.Tensor) -> float:
    return float((a.double() - truth.double()).abs().mean())


def max_rel_err(a: torch.Tensor, truth: torch.Tensor) -> float:
    """max |a - truth| / max |truth| — a norm-wise relative error, stable near zeros."""
    return float((a.double() - truth.double()).abs().max() / truth.double().abs().max())


def impl_cases(op: str, names: list[str]) -> list[str]:
    """Every implementation of each variant in ``names`` as a test id: ``"hf"`` (torch) and
    ``"hf/triton"`` when the variant has a Triton implementation."""
    return [n if impl == "torch" else f"{n}/{impl}" for n in names for impl in kernels.impls(op, n)]


def variant(op: str, case: str) -> Callable:
    """The callable an ``impl_cases`` id names, its implementation forced (``"hf"`` -> torch)."""
    name, _, impl = case.partition("/")
    return kernels.get(op, name, impl=impl or "torch")
