"""Weight quantization of the rollout engine: quantize, then dequantize (``Knobs.weights``).

Why: real RL stacks sample from quantized weights while the trainer keeps full precision
(FlashRL: INT8/FP8 rollouts corrected by TIS; QeRL; FP8 rollouts in verl and slime), a
train-inference mismatch far larger than bf16 arithmetic. Only the numerics matter here, so a
quantized weight is rounded to its format and immediately dequantized to a float tensor that
the ordinary GEMM uses (a quantized kernel multiplies the same values, in another order).
Every format scales along the last (input-feature) dimension, per output row:

- ``fp8_e4m3``: one fp32 scale per output channel, ``amax / 448``, values rounded to
  float8 e4m3 (round to nearest even, saturated to +-448), as vLLM's per-channel FP8.
- ``int8``: symmetric per output channel, ``scale = amax / 127``, ``q = round(w / scale)``
  in [-127, 127] (round half to even).
- ``int4``: GGUF ``Q4_0``: blocks of 32 input features, ``d = m / -8`` where ``m`` is the
  block's value of largest magnitude (sign kept), ``q = min(15, trunc(w / d + 8.5))`` with
  ``1 / d`` in fp32, and ``d`` stored in fp16, dequantized as ``(q - 8) * d``
  (ggml ``quantize_row_q4_0_ref`` / ``dequantize_row_q4_0``).

A tensor a format cannot hold (``unfit``: int4 on a width that is not a multiple of 32) is
kept in full precision by the engine and listed (``Engine.unquantized``), as llama.cpp keeps a
tensor in F16 when no quantized block fits its rows; ``fake_quantize`` itself refuses it.
"""

from __future__ import annotations

import torch

FORMATS = ("none", "fp8_e4m3", "int8", "int4")
FP8_MAX = 448.0  # largest finite float8 e4m3fn
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
    if fmt == "none":
        return x
    if fmt == "fp8_e4m3":
        return _fp8_e4m3(x)
    if fmt == "int8":
        return _int8(x)
    if (why := unfit(fmt, x.shape)) is not None:
        raise ValueError(f"weights={fmt!r}: {name} (shape {tuple(x.shape)}) {why}; use weights='int8' or "
                         f"'fp8_e4m3' for it")
    return _q4_0(x)


def unfit(fmt: str, shape: torch.Size | tuple[int, ...]) -> str | None:
    """Why a weight of ``shape`` [..., out, in] cannot take ``fmt``, or None when it can."""
    if fmt == "int4" and shape[-1] % Q4_BLOCK:
        return f"has {shape[-1]} input features, not a multiple of int4's block of {Q4_BLOCK}"
    return None


def _row_scale(x: torch.Tensor, qmax: float) -> torch.Tensor:
    """Per-output-row scale ``amax / qmax`` [..., out, 1]; an all-zero row gets scale 1."""
    amax = x.abs().amax(-1, keepdim=True)
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def _fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    scale = _row_scale(x, FP8_MAX)
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.float() * scale


def _int8(x: torch.Tensor) -> torch.Tensor:
    scale = _row_scale(x, INT8_MAX)
    return (x / scale).round().clamp(-INT8_MAX, INT8_MAX) * scale


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    blocks = x.reshape(*x.shape[:-1], -1, Q4_BLOCK)  # [..., out, in/32, 32]
    first_max = blocks.abs().argmax(-1, keepdim=True)  # ggml keeps the first of equal magnitudes
    d = blocks.gather(-1, first_max) / -8.0  # [..., 1]
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp(torch.trunc(blocks * inv + 8.5), max=15.0)  # 0..15
    return ((q - 8.0) * d.half().float()).reshape(x.shape)
