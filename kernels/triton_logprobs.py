"""Fused Triton forward for token logprobs + entropy: the ``[N, V]`` logits never exist.

Each program owns ``BLOCK_N`` rows and walks the vocabulary in ``BLOCK_V`` tiles. For a tile
it computes ``h @ W_tile.T`` with ``tl.dot`` (fp32 accumulation over ``BLOCK_H`` slices),
rounds the logits to the input dtype like a bf16 GEMM output (so it agrees with ``chunked``),
divides by the temperature, and updates three running quantities per row, relative to the
running max ``m``:

    s = sum exp(z - m)          a = sum exp(z - m) * (z - m)       target logit z_t

On a new max ``m'``: ``s <- s * exp(m - m')`` and ``a <- exp(m - m') * (a + (m - m') * s)``.
At the end ``lse = m + log s``, ``logprob = z_t - lse`` and
``entropy = log s - a / s`` — a form without the cancellation of ``lse - E_p[z]`` at large
logits. Backward is ``logprobs.ChunkedLogprobs``' recompute.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import compute_dtype
from .triton_common import block, compute_tl, native_dot, round_code, round_to


@triton.jit
def _logprobs_kernel(
    Hd, W, T, LP, ENT, LSE,  # hidden[N, H], weight[V, H], targets[N], out logprob/entropy/lse[N]
    N, V, H, inv_temp,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    COMPUTE: tl.constexpr, LOGIT_ROUND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    tgt = tl.load(T + rows, mask=rmask, other=0)
    m = tl.full([BLOCK_N], -float("inf"), COMPUTE)
    s = tl.zeros([BLOCK_N], COMPUTE)
    a = tl.zeros([BLOCK_N], COMPUTE)
    zt = tl.zeros([BLOCK_N], COMPUTE)
    for v0 in range(0, V, BLOCK_V):
        vs = v0 + tl.arange(0, BLOCK_V)
        vmask = vs < V
        acc = tl.zeros([BLOCK_N, BLOCK_V], COMPUTE)
        for h0 in range(0, H, BLOCK_H):
            hs = h0 + tl.arange(0, BLOCK_H)
            hmask = hs < H
            x = tl.load(Hd + rows[:, None] * H + hs[None, :], mask=rmask[:, None] & hmask[None, :], other=0.0)
            w = tl.load(W + vs[:, None] * H + hs[None, :], mask=vmask[:, None] & hmask[None, :], other=0.0)
            if UPCAST:  # interpreter: 16-bit arithmetic is wrong there; compiled: fp32/fp64 inputs
                x = x.to(COMPUTE)
                w = w.to(COMPUTE)
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee", out_dtype=COMPUTE)
            else:
                acc += tl.dot(x, tl.trans(w), out_dtype=COMPUTE)
        z = round_to(acc, LOGIT_ROUND).to(COMPUTE) * inv_temp  # [BLOCK_N, BLOCK_V]
        z = tl.where(vmask[None, :], z, -float("inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        shift = tl.where(vmask[None, :], z - m_new[:, None], 0.0)  # finite even in the masked tail
        e = tl.where(vmask[None, :], tl.exp(shift), 0.0)
        alpha = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
        moved = tl.where(s > 0, m - m_new, 0.0)  # avoids -inf * 0 before the first tile
        a = alpha * (a + moved * s) + tl.sum(e * shift, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        zt += tl.sum(tl.where(vs[None, :] == tgt[:, None], z, 0.0), axis=1)
        m = m_new
    log_s = tl.log(s)
    lse = m + log_s
    tl.store(LP + rows, zt - lse, mask=rmask)
    tl.store(ENT + rows, log_s - a / s, mask=rmask)
    tl.store(LSE + rows, lse, mask=rmask)


def forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprob[N], entropy[N], logsumexp[N])``; ``rows`` (the backward chunk) is unused here
    because the forward keeps no ``[rows, V]`` buffer at all."""
    n, hdim = hidden.shape
    vocab = weight.shape[0]
    compute = compute_dtype(hidden.dtype)
    lp = torch.empty(n, dtype=compute, device=hidden.device)
    ent, lse = torch.empty_like(lp), torch.empty_like(lp)
    if n:
        upcast = not native_dot() or hidden.dtype in (torch.float32, torch.float64)
        block_n = 16 if hidden.is_cpu else 64
        _logprobs_kernel[(triton.cdiv(n, block_n),)](
            hidden.contiguous(), weight.contiguous(), targets.contiguous(), lp, ent, lse,
            n, vocab, hdim, 1.0 / temperature,
            BLOCK_N=block_n, BLOCK_V=block(min(vocab, 128)), BLOCK_H=block(min(hdim, 64)),
            COMPUTE=compute_tl(compute), LOGIT_ROUND=round_code(hidden.dtype), UPCAST=upcast, IEEE=upcast,
        )
    return lp, ent, lse
