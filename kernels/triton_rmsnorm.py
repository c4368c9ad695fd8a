"""Triton RMSNorm (+ fused residual add) with the semantics of ``rmsnorm.reference``.

One program per row: load (upcast), add the residual, write the rounded sum as the new
residual, reduce ``sum(h*h)`` in registers, normalise from the *unrounded* sum, multiply the
weight, round once. Imported lazily by ``kernels.rmsnorm.triton``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rmsnorm import reference_dtypes
from .triton_common import block, compute_tl, round_code, round_to


@triton.jit
def _rmsnorm_kernel(
    X, W, R, Y, RO,  # x[M, H], weight[H], residual[M, H], out[M, H], new_residual[M, H]
    H, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, COMPUTE: tl.constexpr,
    Y_ROUND: tl.constexpr, RO_ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    h = tl.load(X + row * H + cols, mask=mask, other=0.0).to(COMPUTE)
    if HAS_RES:
        h += tl.load(R + row * H + cols, mask=mask, other=0.0).to(COMPUTE)
        tl.store(RO + row * H + cols, round_to(h, RO_ROUND), mask=mask)
    inv_rms = tl.rsqrt(tl.sum(h * h, axis=0) / H + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(COMPUTE)
    tl.store(Y + row * H + cols, round_to(h * inv_rms * w, Y_ROUND), mask=mask)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Launch wrapper; non-contiguous inputs are copied to contiguous first."""
    compute, res_dtype = reference_dtypes(x, weight, residual)
    hidden = x.shape[-1]
    x2 = x.contiguous().view(-1, hidden)  # [M, H]
    y = torch.empty_like(x2)
    if residual is None:
        r2 = new_res = x2  # unused placeholders (HAS_RES=False)
    else:
        r2 = residual.contiguous().view(-1, hidden)
        new_res = torch.empty(x2.shape, dtype=res_dtype, device=x.device)
    if x2.shape[0]:
        _rmsnorm_kernel[(x2.shape[0],)](
            x2, weight.contiguous(), r2, y, new_res, hidden, float(eps),
            HAS_RES=residual is not None, BLOCK=block(hidden, floor=1), COMPUTE=compute_tl(compute),
            Y_ROUND=round_code(x.dtype), RO_ROUND=round_code(res_dtype or x.dtype),
        )
    y = y.view(x.shape)
    return y if residual is None else (y, new_res.view(x.shape))
