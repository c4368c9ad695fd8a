"""Triton RMSNorm (+ fused residual add): one kernel, the numerics a constexpr.

``NUMERICS`` picks where the kernel rounds, so one kernel serves three torch variants:

* ``SINGLE`` (``reference``, ``fp32_residual``): add the residual in the compute dtype, write
  the rounded sum as the new residual, normalise the *unrounded* sum, multiply the weight,
  round once.
* ``HF`` (``hf``): the sum is rounded to the activation dtype (a bf16 residual stream) and
  normalised in fp32; the normalised value is rounded to the activation dtype *before* the
  weight multiply, whose product is rounded to the output dtype (torch promotion).
* ``FUSED_ADD`` (``fused_add``, vLLM): like ``HF`` but the residual is cast to the activation
  dtype before the add and the weight is cast to it too.

Bandwidth: a program owns ``BLOCK_M`` whole rows (a ``[BLOCK_M, BLOCK_H]`` register tile), so
narrow rows still give each program ~8K elements to stream and wide rows one or two rows with
8-16 warps; the weight row is loaded once per program. RMSNorm moves ``2-4 x M x H`` elements and
computes almost nothing, so the only goal is full-width coalesced loads and enough bytes in
flight per SM. Imported lazily by ``kernels.rmsnorm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rmsnorm import reference_dtypes
from .triton_common import block, compute_tl, round_code, round_to

SINGLE, HF, FUSED_ADD = 0, 1, 2
_NUMERICS = {"reference": SINGLE, "fp32_residual": SINGLE, "hf": HF, "fused_add": FUSED_ADD}
#: Elements of one program's tile: enough bytes in flight, few enough registers.
TILE_ELEMENTS = 8192


@triton.jit
def _rmsnorm_kernel(
    X, W, R, Y, RO,  # x[M, H], weight[H], residual[M, H], out[M, H], new_residual[M, H]
    M, H, eps,
    HAS_RES: tl.constexpr, NUMERICS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
    COMPUTE: tl.constexpr, ACT_ROUND: tl.constexpr, Y_ROUND: tl.constexpr, RO_ROUND: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < M)[:, None] & (cols < H)[None, :]
    offs = rows[:, None] * H + cols[None, :]  # [BLOCK_M, BLOCK_H]
    h = tl.load(X + offs, mask=mask, other=0.0).to(COMPUTE)
    if HAS_RES:
        r = tl.load(R + offs, mask=mask, other=0.0).to(COMPUTE)
        if NUMERICS == 2:  # vLLM casts the residual to the activation dtype first
            r = round_to(r, ACT_ROUND).to(COMPUTE)
        h = h + r
        if NUMERICS != 0:  # a residual stream in the activation dtype
            h = round_to(h, ACT_ROUND).to(COMPUTE)
        tl.store(RO + offs, round_to(h, RO_ROUND), mask=mask)
    w = tl.load(W + cols, mask=cols < H, other=0.0).to(COMPUTE)[None, :]  # [1, BLOCK_H]
    if NUMERICS == 0:
        inv_rms = tl.rsqrt(tl.sum(h * h, axis=1) / H + eps)  # [BLOCK_M]
        y = h * inv_rms[:, None] * w
    else:  # fp32 variance even for float64 activations, as transformers and vLLM do
        hf = h.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=1) / H + eps)
        normed = round_to(hf * inv_rms[:, None], ACT_ROUND).to(COMPUTE)
        if NUMERICS == 2:
            w = round_to(w, ACT_ROUND).to(COMPUTE)
        y = normed * w
    tl.store(Y + offs, round_to(y, Y_ROUND), mask=mask)


def _dtypes(numerics: str, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None):
    """(compute, activation, output, new-residual) dtypes of the torch variant ``numerics``."""
    if numerics in ("reference", "fp32_residual"):
        compute, res = reference_dtypes(x, weight, residual)
        if numerics == "fp32_residual":
            compute, res = torch.float32, torch.float32
        return compute, x.dtype, x.dtype, res
    act = x.dtype if numerics == "fused_add" or residual is None else torch.promote_types(x.dtype, residual.dtype)
    out = act if numerics == "fused_add" else torch.promote_types(weight.dtype, act)
    compute = torch.float64 if torch.float64 in (act, out) else torch.float32
    return compute, act, out, act


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *, numerics: str
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Launch wrapper for the torch variant ``numerics``; non-contiguous inputs are copied first."""
    compute, act, out, res_dtype = _dtypes(numerics, x, weight, residual)
    hidden = x.shape[-1]
    x2 = x.contiguous().view(-1, hidden)  # [M, H]
    rows = x2.shape[0]
    y = torch.empty(x2.shape, dtype=out, device=x.device)
    if residual is None:
        r2 = new_res = x2  # unused placeholders (HAS_RES=False)
    else:
        r2 = residual.contiguous().view(-1, hidden)
        new_res = torch.empty(x2.shape, dtype=res_dtype, device=x.device)
    if rows:
        block_h = block(hidden, floor=1)
        block_m = min(max(1, TILE_ELEMENTS // block_h), block(rows, floor=1))
        _rmsnorm_kernel[(triton.cdiv(rows, block_m),)](
            x2, weight.contiguous(), r2, y, new_res, rows, hidden, float(eps),
            HAS_RES=residual is not None, NUMERICS=_NUMERICS[numerics], BLOCK_M=block_m, BLOCK_H=block_h,
            COMPUTE=compute_tl(compute), ACT_ROUND=round_code(act), Y_ROUND=round_code(out),
            RO_ROUND=round_code(res_dtype or x.dtype),
            num_warps=min(16, max(4, block_m * block_h // 1024)),
        )
    y = y.view(x.shape)
    return y if residual is None else (y, new_res.view(x.shape))
