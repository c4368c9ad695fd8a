"""Triton router top-k with the semantics of ``router.stable``.

One program per token: scores over all experts, ``K`` rounds of arg-max where the lowest
expert id wins ties (``tie_break_left=True``), then renormalisation. With a bf16/fp16 compute
dtype the kernel rounds where torch would: the logits on the cast, the scores after
softmax/sigmoid, the top-k sum and the division. Imported lazily by
``kernels.router.triton``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import block, compute_tl, round_code, round_to


@triton.jit
def _router_kernel(
    L, IDS, WTS,  # logits[N, E], ids[N, K] int64, weights[N, K]
    E, K,
    SOFTMAX: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    COMPUTE: tl.constexpr, ROUND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    emask = cols < E
    z = round_to(tl.load(L + row * E + cols, mask=emask, other=0.0).to(COMPUTE), ROUND)
    if SOFTMAX:
        z = tl.where(emask, z, -float("inf"))
        e = tl.where(emask, tl.exp(z - tl.max(z, axis=0)), 0.0)
        s = e / tl.sum(e, axis=0)
    else:
        s = 1.0 / (1.0 + tl.exp(-z))
    s = round_to(s, ROUND)
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    wts = tl.zeros([BLOCK_K], dtype=COMPUTE)
    free = emask
    for i in range(K):
        idx = tl.argmax(tl.where(free, s, -float("inf")), axis=0, tie_break_left=True)
        w = tl.sum(tl.where(cols == idx, s, 0.0), axis=0)
        ids = tl.where(kk == i, idx.to(tl.int64), ids)
        wts = tl.where(kk == i, w, wts)
        free = free & (cols != idx)
    if RENORM:
        total = round_to(tl.sum(tl.where(kk < K, wts, 0.0), axis=0), ROUND)
        wts = round_to(wts / total, ROUND)
    tl.store(IDS + row * K + kk, ids, mask=kk < K)
    tl.store(WTS + row * K + kk, wts, mask=kk < K)


def router_topk(
    logits: torch.Tensor, k: int, *, scoring: str, renormalize: bool, compute: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch wrapper; math runs in fp32 (float64 for float64), rounded to ``compute`` when it
    is a 16-bit dtype; weights are returned in ``compute``."""
    n, n_experts = logits.shape
    ids = torch.empty(n, k, dtype=torch.int64, device=logits.device)
    wts = torch.empty(n, k, dtype=compute, device=logits.device)
    if n:
        _router_kernel[(n,)](
            logits.contiguous(), ids, wts, n_experts, k,
            SOFTMAX=scoring == "softmax", RENORM=renormalize,
            BLOCK_E=block(n_experts, floor=1), BLOCK_K=block(k, floor=1),
            COMPUTE=compute_tl(torch.float64 if compute == torch.float64 else torch.float32),
            ROUND=round_code(compute),
        )
    return ids, wts
