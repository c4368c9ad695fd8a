"""Triton RoPE with the semantics of ``rope.fp32_compute``.

One program per token: ``angle = float(position) * inv_freq`` (the same fp32 ``inv_freq``
tensor the torch variants use, so angles are bit-identical), fp32 sin/cos, rotation of all
heads in fp32 registers, one rounding on store. Imported lazily by ``kernels.rope.triton``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rope import inv_freq
from .triton_common import block, round_code, round_to


@triton.jit
def _rope_kernel(
    Y, P, F,  # y[N, heads, D] (a copy of x, rotated in place), positions[N], inv_freq[R/2]
    HEADS, D, HALF,
    NEOX: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr, ROUND: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    hd = tl.arange(0, BLOCK_HEADS)
    jmask = j < HALF
    ang = tl.load(P + tok).to(tl.float32) * tl.load(F + j, mask=jmask, other=0.0)  # [BLOCK_HALF]
    c = tl.cos(ang)[None, :]
    s = tl.sin(ang)[None, :]
    if NEOX:
        i1, i2 = j, j + HALF
    else:
        i1, i2 = 2 * j, 2 * j + 1
    base = Y + tok * HEADS * D + hd[:, None] * D  # [BLOCK_HEADS, 1] row starts
    mask = (hd[:, None] < HEADS) & jmask[None, :]
    x1 = tl.load(base + i1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + i2[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(base + i1[None, :], round_to(x1 * c - x2 * s, ROUND), mask=mask)
    tl.store(base + i2[None, :], round_to(x2 * c + x1 * s, ROUND), mask=mask)


def rope(x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int, style: str) -> torch.Tensor:
    """Launch wrapper; the pass-through dims are copied by the ``clone``."""
    n, heads, head_dim = x.shape
    y = x.contiguous().clone()  # [N, heads, D]
    if n:
        freqs = inv_freq(theta, rotary_dim, torch.float32, x.device)  # [R/2]
        _rope_kernel[(n,)](
            y, positions.contiguous(), freqs, heads, head_dim, rotary_dim // 2,
            NEOX=style == "neox", BLOCK_HEADS=block(heads, floor=1), BLOCK_HALF=block(rotary_dim // 2, floor=1),
            ROUND=round_code(x.dtype),
        )
    return y
