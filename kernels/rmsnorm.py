"""RMSNorm: ``y = x / sqrt(mean(x**2) + eps) * weight``, optionally fused with the residual add.

Ring-linear §5.2.1 lists the three RMSNorm choices that move train-inference mismatch:
compute precision, the eps value, and whether the residual stream is kept in fp32 and
un-fused from the norm. Each variant below is one engine's answer to those choices.

Call contract (docs/architecture.md): ``rmsnorm(x[..., H], weight[H], eps, residual=None)``
returns ``y`` or, when ``residual`` is given, ``(y, new_residual)`` with
``new_residual = x + residual`` in the variant's residual dtype; the norm is applied to
``new_residual``. ``y`` has ``x.dtype`` (``hf`` keeps torch's type promotion instead).
"""

from __future__ import annotations

from typing import Callable

import torch

from . import _checks, _triton
from .registry import register

Out = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def check(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> None:
    """Shared argument validation (the Triton wrapper uses it too)."""
    if _checks.skipped():
        return
    _checks.floating("x", x)
    _checks.floating("weight", weight)
    _checks.ndim("weight", weight, 1, "[H]")
    if x.dim() < 1:
        raise ValueError(f"{_checks.describe('x', x)}: expected at least 1 dim [..., H]")
    _checks.dim_matches("x", x, -1, "weight", weight, 0)
    _checks.positive("eps", eps)
    if residual is not None:
        _checks.floating("residual", residual)
        _checks.same_shape("x", x, "residual", residual)
        _checks.same_device(x=x, weight=weight, residual=residual)
    else:
        _checks.same_device(x=x, weight=weight)


def reference_dtypes(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.dtype, torch.dtype | None]:
    """(compute dtype, returned residual dtype) of ``reference`` — shared with the Triton kernel."""
    if residual is None:
        return _checks.compute_dtype(x.dtype, weight.dtype), None
    return _checks.compute_dtype(x.dtype, weight.dtype, residual.dtype), torch.promote_types(x.dtype, residual.dtype)


def _single_rounding(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    compute: torch.dtype,
    residual_dtype: torch.dtype | None,
) -> Out:
    """Everything in ``compute``, one rounding to ``x.dtype`` at the very end.

    The norm reads the *unrounded* sum ``x + residual``; only the returned residual is
    rounded to ``residual_dtype``.
    """
    h = x.to(compute)  # [..., H]
    if residual is not None:
        h = h + residual.to(compute)
    inv_rms = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    y = (h * inv_rms * weight.to(compute)).to(x.dtype)
    if residual is None:
        return y
    return y, h.to(residual_dtype)


@register("rmsnorm", "reference")
def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> Out:
    """Textbook RMSNorm: fp32 math (float64 for float64 inputs), a single final rounding.

    Who: nobody ships exactly this; it is the yardstick. Called on float64 inputs it *is* the
    float64 ground truth every other variant is measured against. The residual sum is returned
    in ``promote(x.dtype, residual.dtype)``.
    """
    check(x, weight, eps, residual)
    return _single_rounding(x, weight, eps, residual, *reference_dtypes(x, weight, residual))


@register("rmsnorm", "fp32_residual")
def fp32_residual(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> Out:
    """Ring-linear's *aligned* setting: fp32 norm, residual stream kept in fp32, add un-fused.

    Who: Ring-linear §5.2.1 ("Keep residual computation in FP32, and un-fuse the RMSNorm and
    residual in both training and inference"); Megatron's ``fp32_residual_connection``.
    Why it differs: the residual never gets rounded to bf16, so the error of layer i does not
    leak into every later layer through the residual stream. Accepts a bf16 or fp32
    ``residual`` (upcast losslessly) and returns an fp32 ``new_residual``; the math is pinned
    to fp32 even for float64 inputs, so on float64 it deviates from ``reference`` by fp32
    rounding only (~1e-7 relative).
    """
    check(x, weight, eps, residual)
    return _single_rounding(x, weight, eps, residual, torch.float32, torch.float32)


@register("rmsnorm", "hf")
def hf(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> Out:
    """transformers ``LlamaRMSNorm`` / ``Qwen3RMSNorm`` forward, bit for bit.

    Who: the HF training engine (and FSDP/verl trainers built on it). fp32 variance and
    normalisation, then ``hidden.to(input_dtype)`` *before* ``weight * hidden``: the product
    with the weight happens in the activation dtype (or promotes to fp32 when the weight is
    fp32 — the output dtype follows torch promotion, exactly like the module). With
    ``residual`` it does what a transformers decoder layer does: ``residual + x`` in the
    activation dtype (a bf16 residual stream), then the norm; that sum is ``new_residual``.
    Why it differs from ``reference``: two roundings (after normalising, after the weight
    multiply) instead of one, and a bf16-rounded residual stream.
    """
    check(x, weight, eps, residual)
    h = x if residual is None else residual + x  # [..., H], activation dtype
    input_dtype = h.dtype
    hidden = h.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    y = weight * hidden.to(input_dtype)
    return y if residual is None else (y, h)


@register("rmsnorm", "fused_add")
def fused_add(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> Out:
    """Fused residual add + RMSNorm in the activation dtype — the inference-engine style.

    Who: vLLM ``fused_add_rms_norm`` (csrc/layernorm_kernels.cu), SGLang's vLLM-kernel path,
    lmdeploy. What the CUDA kernel does, step by step: ``z = input + residual`` in the activation dtype
    (``scalar_t``, e.g. bf16 ``__hadd2``) and that rounded ``z`` is written back as the new
    residual; the variance is accumulated in fp32 from the *rounded* ``z`` and finished as
    ``rsqrtf(sum / hidden_size + eps)``; the output is ``(scalar_t)(z * inv_rms)`` times
    ``weight`` in ``scalar_t`` (the weight is stored in the activation dtype, so we cast it).
    Without residual it is vLLM's ``rms_norm`` kernel (same output formula).
    Why it matters: numerically this equals ``hf`` with an activation-dtype weight, except for
    the order of the fp32 variance reduction (a CUDA block reduction on GPU, torch's sum here),
    so fusion per se is not what breaks alignment; the bf16 residual stream it implies is —
    compare it with ``fp32_residual``. (FlashInfer's/SGLang's fused kernel differs again: it
    normalises the unrounded fp32 sum and multiplies the weight in fp32.)
    """
    check(x, weight, eps, residual)
    act = x.dtype
    z = x if residual is None else x + residual.to(act)  # [..., H], rounded to act
    zf = z.to(torch.float32)
    inv_rms = torch.rsqrt(zf.pow(2).sum(-1, keepdim=True) / z.shape[-1] + eps)  # [..., 1] fp32
    y = (zf * inv_rms).to(act) * weight.to(act)
    return y if residual is None else (y, z)


@register("rmsnorm", "bf16_compute")
def bf16_compute(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> Out:
    """Every intermediate rounded to bf16: the worst case, kept as a lower bound.

    Who: RMSNorm modules written without the ``.float()`` upcast (quick model ports, custom
    inference kernels that stay in ``scalar_t`` for the sum of squares' result and rsqrt).
    torch still accumulates the mean in fp32 internally, but ``x**2``, the mean, the rsqrt,
    the normalised value and the weight product are each rounded to bf16, and the residual
    add happens in bf16. Why it differs: ~5 roundings of 2**-9 relative each, even for fp32
    or float64 inputs (the output is cast back to ``x.dtype``).
    """
    check(x, weight, eps, residual)
    bf = torch.bfloat16
    h = x.to(bf)
    if residual is not None:
        h = h + residual.to(bf)
    variance = h.pow(2).mean(-1, keepdim=True)
    y = (h * torch.rsqrt(variance + eps) * weight.to(bf)).to(x.dtype)
    return y if residual is None else (y, h)


def _triton_impl(numerics: str) -> Callable[..., Out]:
    """The Triton implementation of torch variant ``numerics`` (one kernel, numerics a constexpr)."""

    def run(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> Out:
        check(x, weight, eps, residual)
        return _triton.load("triton_rmsnorm", x).rmsnorm(x, weight, eps, residual, numerics=numerics)

    run.__doc__ = (f"Triton kernel computing ``{numerics}`` (same roundings; the fp32 variance may sum in "
                   "another order). Who: Liger/unsloth-style fused Triton RMSNorms of training stacks and "
                   "SGLang's Triton backend: residual add fused, whole rows per program in registers.")
    return run


for _name in ("reference", "fp32_residual", "hf", "fused_add"):
    register("rmsnorm", _name, impl="triton")(_triton_impl(_name))
