"""Triton router top-k with the semantics of ``router.stable``.

A program owns ``BLOCK_T`` tokens (a ``[BLOCK_T, E]`` tile): scores over all experts, ``K``
rounds of arg-max where the lowest expert id wins ties (``tie_break_left=True``), then
renormalisation. Why several tokens per program: a row of 64-128 experts is a few hundred bytes,
so one token per program leaves the GPU launching tiny programs instead of streaming logits.
With a bf16/fp16 compute dtype the kernel rounds where torch would: the logits on the cast, the
scores after softmax/sigmoid, the top-k sum and the division. Imported lazily by
``kernels.router``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import block, compute_tl, round_code, round_to

#: Elements of one program's score tile.
TILE_ELEMENTS = 4096


@triton.jit
def _router_kernel(
    L, IDS, WTS,  # logits[N, E], ids[N, K] int64, weights[N, K]
    N, E, K,
    SOFTMAX: tl.constexpr, RENORM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, COMPUTE: tl.constexpr, ROUND: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    rmask = rows < N
    emask = (cols < E)[None, :]
    z = tl.load(L + rows[:, None] * E + cols[None, :], mask=rmask[:, None] & emask, other=0.0)
    z = round_to(z.to(COMPUTE), ROUND)  # [BLOCK_T, BLOCK_E]
    if SOFTMAX:
        z = tl.where(emask, z, -float("inf"))
        e = tl.where(emask, tl.exp(z - tl.max(z, axis=1)[:, None]), 0.0)
        s = e / tl.sum(e, axis=1)[:, None]
    else:
        s = 1.0 / (1.0 + tl.exp(-z))
    s = round_to(s, ROUND)
    kk = tl.arange(0, BLOCK_K)[None, :]
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int64)
    wts = tl.zeros([BLOCK_T, BLOCK_K], dtype=COMPUTE)
    free = emask & (rows[:, None] >= 0)  # [BLOCK_T, BLOCK_E]: loop-carried, so full shape
    for i in range(K):
        idx = tl.argmax(tl.where(free, s, -float("inf")), axis=1, tie_break_left=True)[:, None]  # [BLOCK_T, 1]
        w = tl.sum(tl.where(cols[None, :] == idx, s, 0.0), axis=1)[:, None]
        ids = tl.where(kk == i, idx.to(tl.int64), ids)
        wts = tl.where(kk == i, w, wts)
        free = free & (cols[None, :] != idx)
    if RENORM:
        total = round_to(tl.sum(tl.where(kk < K, wts, 0.0), axis=1), ROUND)[:, None]
        wts = round_to(wts / total, ROUND)
    out = rows[:, None] * K + kk
    omask = rmask[:, None] & (kk < K)
    tl.store(IDS + out, ids, mask=omask)
    tl.store(WTS + out, wts, mask=omask)


def router_topk(
    logits: torch.Tensor, k: int, *, scoring: str, renormalize: bool, compute: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch wrapper; math runs in fp32 (float64 for float64), rounded to ``compute`` when it
    is a 16-bit dtype; weights are returned in ``compute``."""
    n, n_experts = logits.shape
    ids = torch.empty(n, k, dtype=torch.int64, device=logits.device)
    wts = torch.empty(n, k, dtype=compute, device=logits.device)
    if n:
        block_e = block(n_experts, floor=1)
        block_t = min(max(1, TILE_ELEMENTS // block_e), block(n, floor=1))
        _router_kernel[(triton.cdiv(n, block_t),)](
            logits.contiguous(), ids, wts, n, n_experts, k,
            SOFTMAX=scoring == "softmax", RENORM=renormalize,
            BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=block(k, floor=1),
            COMPUTE=compute_tl(torch.float64 if compute == torch.float64 else torch.float32),
            ROUND=round_code(compute), num_warps=4,
        )
    return ids, wts
