"""Weight and activation quantization of the rollout engine: quantize, then dequantize
(``Knobs.weights``, ``Knobs.activations``).

Why: real RL stacks sample from quantized weights while the trainer keeps full precision
(FlashRL: INT8/FP8 rollouts corrected by TIS; QeRL; FP8 rollouts in verl and slime), a
train-inference mismatch far larger than bf16 arithmetic. Only the numerics matter here, so a
quantized tensor is rounded to its format and immediately dequantized to a float tensor that
the ordinary GEMM uses (a quantized kernel multiplies the same values, in another order).

Each format reproduces one real implementation's arithmetic step by step, fp32 rounding
included, because at a tie the fp32 quotient decides the rounding direction (an exact quotient
would move 3.6 k int8 elements of smollm2-135m by one step; ``benchmarks/quant_rounding.py``):

- ``fp8_e4m3``: per output channel, ``s = fl32(amax / 448)``, ``q = e4m3_rne(clamp(fl32(w / s)))``
  (compressed-tensors / llm-compressor ``FP8_DYNAMIC`` weights, the per-channel FP8
  checkpoints vLLM serves).
- ``fp8_e4m3_tensor``: one scale per matrix (per expert for stacked experts),
  ``s = fl32(amax / 448)``, ``q = e4m3_rne(clamp(fl32(w * fl32(1 / s))))``: vLLM's online
  ``quantization="fp8"`` (``ops.scaled_fp8_quant(weight, scale=None)``, whose kernel multiplies
  by the inverted scale), i.e. FlashRL-style FP8 rollouts.
- ``int8``: symmetric per output channel, ``s = fl32(amax / 127)``, ``q = rne(fl32(w / s))`` in
  [-127, 127]: vLLM's online ``experts_int8`` (``quantize_in_place_and_get_scales``) on fp32
  weights.
- ``int4``: GGUF ``Q4_0``: blocks of 32 input features, ``d = m / -8`` where ``m`` is the
  block's value of largest magnitude (sign kept, first one wins), ``q = min(15, trunc(w * fl32(1/d)
  + 8.5))``, ``d`` stored in fp16, dequantized as ``(q - 8) * d`` (ggml ``quantize_row_q4_0_ref``;
  bit for bit the ``gguf`` package's ``Q4_0``, see ``q4_0_blocks``).

Activations (``fp8``): vLLM's ``dynamic_per_token_scaled_fp8_quant`` of every quantized linear
layer's input: per token ``s = max(fl32(amax / 448), 1 / (448 * 512))``, ``q =
e4m3_rne(clamp(fl32(x / s)))`` (this kernel divides; the per-tensor one multiplies).

A weight a format cannot hold (``unfit``: int4 on a width that is not a multiple of 32) is
kept in full precision by the engine and listed (``Engine.unquantized``), as llama.cpp keeps a
tensor in F16 when no quantized block fits its rows; ``fake_quantize`` itself refuses it.
An int4 block whose scale overflows fp16 (``|m| / 8`` above 65504: a weight above ~5.2e5) would
dequantize to inf and NaN, as ggml's and ``gguf``'s own Q4_0 do; such a block keeps its
full-precision values and is named in a warning (``overflowing_blocks``). An empty matrix is
returned as it is: there is nothing to round.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

FORMATS = ("none", "fp8_e4m3", "int8", "int4", "fp8_e4m3_tensor")
ACTIVATION_FORMATS = ("none", "fp8")
FP8_MAX = 448.0  # largest finite float8 e4m3fn
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's min_scaling_factor: an all-zero token keeps a finite scale
INT8_MAX = 127
Q4_BLOCK = 32


def fake_quantize(w: torch.Tensor, fmt: str, name: str = "weight") -> torch.Tensor:
    """``w`` [..., out, in] rounded to ``fmt`` and dequantized: float32, same shape.
    ``name`` labels errors (the engine passes the tensor's engine name)."""
    if fmt not in FORMATS:
        raise ValueError(f"weights={fmt!r} is not a quantization format; valid: {list(FORMATS)}")
    if w.ndim < 2:
        raise ValueError(f"{name}: weight quantization scales per output row and needs a matrix; "
                         f"got shape {tuple(w.shape)}")
    x = w.detach().float()
    if fmt == "none" or x.numel() == 0:
        return x
    if fmt == "fp8_e4m3":
        return _fp8_e4m3(x, x.abs().amax(-1, keepdim=True), invert=False)
    if fmt == "fp8_e4m3_tensor":
        return _fp8_e4m3(x, x.abs().amax((-2, -1), keepdim=True), invert=True)
    if fmt == "int8":
        return _int8(x)
    if (why := unfit(fmt, x.shape)) is not None:
        raise ValueError(f"weights={fmt!r}: {name} (shape {tuple(x.shape)}) {why}; use weights='int8' or "
                         f"'fp8_e4m3' for it")
    d, q = q4_0_blocks(x)
    values = (q.float() - 8.0) * d.float()
    if (n := int((over := overflowing_blocks(d)).sum())) > 0:
        log.warning("weights='int4': %d of %d blocks of %s (shape %s) stay in full precision: their fp16 scale "
                    "|max| / 8 overflows (a weight above %.3g), where ggml's Q4_0 gives inf and NaN",
                    n, d.numel(), name, tuple(x.shape), Q4_SCALE_LIMIT)
        values = torch.where(over, x.reshape(values.shape), values)
    return values.reshape(x.shape)


def fake_quantize_activations(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """A linear layer's input ``x`` [..., features] as the quantized GEMM sees it, back in
    ``x.dtype`` (the engine's GEMM runs in its activation dtype, so the dequantized values are
    rounded to it as the dequantized weights are). ``fmt="none"`` returns ``x`` itself."""
    if fmt not in ACTIVATION_FORMATS:
        raise ValueError(f"activations={fmt!r} is not an activation format; valid: {list(ACTIVATION_FORMATS)}")
    if fmt == "none":
        return x
    xf = x.float()
    scale = torch.clamp_min(xf.abs().amax(-1, keepdim=True) / FP8_MAX, FP8_MIN_SCALE)
    return _e4m3(xf / scale).float().mul(scale).to(x.dtype)


def unfit(fmt: str, shape: torch.Size | tuple[int, ...]) -> str | None:
    """Why a weight of ``shape`` [..., out, in] cannot take ``fmt``, or None when it can."""
    if fmt == "int4" and shape[-1] % Q4_BLOCK:
        return f"has {shape[-1]} input features, not a multiple of int4's block of {Q4_BLOCK}"
    return None


Q4_SCALE_LIMIT = 8.0 * 65520.0
"""Smallest block magnitude whose Q4_0 scale ``m / -8`` rounds to inf in fp16 (65504 is fp16's
largest finite value; 65520 and above round up to inf)."""


def overflowing_blocks(d: torch.Tensor) -> torch.Tensor:
    """[..., in/32, 1] bool: the Q4_0 blocks whose fp16 scale ``d`` (``q4_0_blocks``) is not finite."""
    return ~torch.isfinite(d)


def q4_0_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF Q4_0 of float32 ``x`` [..., in] (``in`` a multiple of 32) -> (``d`` float16
    [..., in/32, 1], ``q`` uint8 codes 0..15 [..., in/32, 32]): the two fields of a ggml
    ``block_q4_0``, so tests compare them with the ``gguf`` package's bytes."""
    blocks = x.reshape(*x.shape[:-1], -1, Q4_BLOCK)  # [..., in/32, 32]
    first_max = blocks.abs().argmax(-1, keepdim=True)  # ggml keeps the first of equal magnitudes
    d = blocks.gather(-1, first_max) / -8.0  # [..., 1]
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp(torch.trunc(blocks * inv + 8.5), max=15.0)  # 0..15
    return d.half(), q.to(torch.uint8)


def _e4m3(y: torch.Tensor) -> torch.Tensor:
    """float32 -> float8 e4m3fn, saturated at +-448 first (the cast itself would give NaN),
    then round to nearest even: the order of vLLM's ``scaled_fp8_conversion``."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _fp8_e4m3(x: torch.Tensor, amax: torch.Tensor, invert: bool) -> torch.Tensor:
    """``x`` over scale ``amax / 448`` (an all-zero group gets scale 1), divided or, when
    ``invert``, multiplied by the fp32 reciprocal as vLLM's per-tensor kernel does."""
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    y = x * (1.0 / scale) if invert else x / scale
    return _e4m3(y).float() * scale


def _int8(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    return (x / scale).round().clamp(-INT8_MAX, INT8_MAX) * scale
