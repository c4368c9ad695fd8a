"""Helpers shared by the Triton kernels (imported only by them, so it may import triton).

Interpreter traps (triton 3.7.1, measured): under ``TRITON_INTERPRET=1`` bf16 arithmetic is
wrong unless values are upcast right after ``tl.load``, and *every* fp32 -> bf16 conversion —
``x.to(tl.bfloat16)`` and storing fp32 into a bf16 pointer alike — truncates instead of
rounding to nearest even (0.1 becomes 0.0996 instead of 0.1001). Compiled CUDA code rounds
correctly. So kernels load with an upcast and round with ``round_to`` before every store or
wherever torch would round, which is exact on both paths (a bf16-representable value
survives the truncating store unchanged).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton import interpreting

NO_ROUND, ROUND_BF16, ROUND_FP16 = 0, 1, 2

_TL = {torch.float32: tl.float32, torch.float64: tl.float64}


def compute_tl(dtype: torch.dtype):
    """The triton dtype of a torch compute dtype (fp32 or float64)."""
    return _TL[dtype]


def round_code(dtype: torch.dtype) -> int:
    """Which ``round_to`` rounding reproduces a cast to ``dtype``."""
    return {torch.bfloat16: ROUND_BF16, torch.float16: ROUND_FP16}.get(dtype, NO_ROUND)


def block(n: int, floor: int = 16) -> int:
    """Power-of-two block covering ``n`` (``tl.dot`` and ``tl.arange`` want powers of two)."""
    return max(floor, triton.next_power_of_2(n))


def native_dot() -> bool:
    """Feed bf16/fp16 tiles to ``tl.dot`` as they are (compiled), or upcast first (interpreter)."""
    return not interpreting()


@triton.jit
def round_to(x, ROUND: tl.constexpr):
    """Round fp32 ``x`` to nearest-even bf16/fp16 and return it as fp32; identity for NO_ROUND."""
    if ROUND == 1:
        x = x.to(tl.float32)  # no-op for fp32; a float64 value is rounded twice (harmless here)
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # keep NaN a NaN
    elif ROUND == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x
