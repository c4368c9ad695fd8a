"""Triton RoPE with the numerics of ``rope.fp32_compute`` or ``rope.hf`` (a constexpr).

Angles: ``float(position) * inv_freq`` in fp32 from the same fp32 ``inv_freq`` tensor the torch
variants use, so angles are bit-identical. Then the angle is reduced to ``[-pi, pi]`` in float64
(``k = round(angle / 2pi)``, ``angle - k * 2pi`` with 2pi split into two fp32-exact parts) before
``tl.cos``/``tl.sin``. Why: compiled Triton lowers fp32 sin/cos to the GPU's approximate
instructions, accurate near zero but off by ~``angle * 2**-22`` for large arguments — at position
32768 and theta 1e6 that is 3 bf16 ulps against torch's correctly reduced ``cosf`` (the H100 run of
``test_rope_triton_compiled``). The torch side is the correct one (float64 evidence in
``tests/kernels/test_kernels_rope.py::test_large_positions_both_impls_match_float64_of_fp32_angles``);
after the reduction the kernel's sin/cos err by < 1e-6 absolute at any position.

Layout: a program owns ``BLOCK_T`` tokens and *all* their heads, as a ``[BLOCK_T, heads, R/2]``
tile: cos/sin are computed once per (token, frequency) and reused by every head, each half of
the rotary dims is one contiguous load per head (neox), and the output is written straight from
registers (no clone of ``x`` first, which used to double the traffic). The pass-through dims of a
partial rotary are copied by the same program. Imported lazily by ``kernels.rope``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .rope import inv_freq
from .triton_common import block, compute_tl, round_code, round_to

#: 2*pi as fp32-exact high part + remainder: ``k * TWO_PI_HI`` is exact in float64.
TWO_PI_HI = float(torch.tensor(2 * math.pi, dtype=torch.float32))
TWO_PI_LO = 2 * math.pi - TWO_PI_HI
#: Elements of one program's rotary tile.
TILE_ELEMENTS = 8192


@triton.jit
def _reduced(ang, TWO_PI_HI: tl.constexpr, TWO_PI_LO: tl.constexpr):
    """fp32 ``ang`` minus the nearest multiple of 2pi, computed in float64, back in fp32."""
    a = ang.to(tl.float64)
    k = tl.floor(a * (0.5 / 3.141592653589793) + 0.5)
    return (a - k * TWO_PI_HI - k * TWO_PI_LO).to(tl.float32)


@triton.jit
def _rope_kernel(
    X, Y, P, F,  # x[N, heads, D] (strided), y[N, heads, D], positions[N], inv_freq[R/2]
    N, HEADS, D, HALF, ROT, sx_t, sx_h,
    NEOX: tl.constexpr, HF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, COMPUTE: tl.constexpr, ROUND: tl.constexpr,
    TWO_PI_HI: tl.constexpr, TWO_PI_LO: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    hd = tl.arange(0, BLOCK_HEADS)
    j = tl.arange(0, BLOCK_HALF)
    tmask = tok < N
    ang = tl.load(P + tok, mask=tmask, other=0).to(tl.float32)[:, None] * tl.load(F + j, mask=j < HALF, other=0.0)[None, :]
    r = _reduced(ang, TWO_PI_HI, TWO_PI_LO)  # [BLOCK_T, BLOCK_HALF]
    c = tl.cos(r)[:, None, :]  # [BLOCK_T, 1, BLOCK_HALF]
    s = tl.sin(r)[:, None, :]
    if HF:  # transformers casts cos/sin to the activation dtype
        c = round_to(c, ROUND)
        s = round_to(s, ROUND)
    c = c.to(COMPUTE)
    s = s.to(COMPUTE)
    if NEOX:
        i1, i2 = j, j + HALF
    else:
        i1, i2 = 2 * j, 2 * j + 1
    tm3 = tmask[:, None, None]
    hm3 = (hd < HEADS)[None, :, None]
    mask = tm3 & hm3 & (j < HALF)[None, None, :]
    xrow = X + tok[:, None, None] * sx_t + hd[None, :, None] * sx_h  # [BLOCK_T, BLOCK_HEADS, 1]
    yrow = Y + tok[:, None, None] * HEADS * D + hd[None, :, None] * D
    x1 = tl.load(xrow + i1[None, None, :], mask=mask, other=0.0).to(COMPUTE)
    x2 = tl.load(xrow + i2[None, None, :], mask=mask, other=0.0).to(COMPUTE)
    if HF:  # every product and sum rounded to the activation dtype
        o1 = round_to(x1 * c, ROUND).to(COMPUTE) - round_to(x2 * s, ROUND).to(COMPUTE)
        o2 = round_to(x2 * c, ROUND).to(COMPUTE) + round_to(x1 * s, ROUND).to(COMPUTE)
    else:
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
    tl.store(yrow + i1[None, None, :], round_to(o1, ROUND), mask=mask)
    tl.store(yrow + i2[None, None, :], round_to(o2, ROUND), mask=mask)
    if BLOCK_TAIL > 0:  # partial rotary: the rest of each head passes through
        t = ROT + tl.arange(0, BLOCK_TAIL)
        tail_mask = tm3 & hm3 & (t < D)[None, None, :]
        tl.store(yrow + t[None, None, :], tl.load(xrow + t[None, None, :], mask=tail_mask, other=0.0), mask=tail_mask)


def rope(
    x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int, style: str, numerics: str
) -> torch.Tensor:
    """Launch wrapper for the torch variant ``numerics`` (``fp32_compute`` or ``hf``)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    n, heads, head_dim = x.shape
    y = torch.empty((n, heads, head_dim), dtype=x.dtype, device=x.device)
    if n:
        half = rotary_dim // 2
        block_heads, block_half = block(heads, floor=1), block(half, floor=1)
        block_t = min(max(1, TILE_ELEMENTS // (2 * block_heads * block_half)), block(n, floor=1))
        tail = head_dim - rotary_dim
        hf = numerics == "hf"
        compute = torch.float64 if hf and x.dtype == torch.float64 else torch.float32
        _rope_kernel[(triton.cdiv(n, block_t),)](
            x, y, positions.contiguous(), inv_freq(theta, rotary_dim, torch.float32, x.device),
            n, heads, head_dim, half, rotary_dim, x.stride(0), x.stride(1),
            NEOX=style == "neox", HF=hf, BLOCK_T=block_t, BLOCK_HEADS=block_heads, BLOCK_HALF=block_half,
            BLOCK_TAIL=block(tail, floor=1) if tail else 0, COMPUTE=compute_tl(compute), ROUND=round_code(x.dtype),
            TWO_PI_HI=TWO_PI_HI, TWO_PI_LO=TWO_PI_LO,
            num_warps=min(16, max(4, 2 * block_t * block_heads * block_half // 1024)),
        )
    return y
