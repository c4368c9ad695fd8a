"""Fused Triton token logprobs + entropy with a Triton backward: the ``[N, V]`` logits never exist.

Forward, split vocabulary. The grid is (row blocks x vocabulary splits): program ``(i, s)`` owns
``BLOCK_N`` rows and the ``s``-th slice of the vocabulary, walks it in ``BLOCK_V`` tiles computing
``h @ W_tile.T`` with ``tl.dot`` (fp32 accumulation over ``BLOCK_H`` slices of the hidden dim;
the logit is rounded to the input dtype like a bf16 GEMM output, so it agrees with the torch
``chunked``), divides by the temperature and keeps three running quantities per row relative to
its running max ``m``::

    s = sum exp(z - m)          a = sum exp(z - m) * (z - m)

On a new max ``m'``: ``s <- s * exp(m - m')`` and ``a <- exp(m - m') * (a + (m - m') * s)``. The
program whose slice holds a row's target stores the target logit. A torch epilogue on the
``[splits, N]`` partials merges them the same way (log-sum-exp merge), then ``lse = M + log S``,
``logprob = z_t - lse`` and ``entropy = log S - A / S`` — without the cancellation of
``lse - E_p[z]`` at large logits. Why split: one program per row block walking 151,936 vocabulary
entries serially left an H100 with 16-32 programs for 132 SMs; the splits fill the card, and
consecutive program ids share a vocabulary slice so ``W`` streams from HBM about once.

Backward. ``d logprob / dz = onehot - p`` and ``d entropy / dz = -p (log p + entropy)`` with
``p = exp(z - lse)``; for upstream ``g_lp, g_ent`` the logit gradient is
``g_z = (onehot g_lp - p (g_lp + g_ent (log p + entropy))) / T``. A Triton kernel recomputes
each ``[BLOCK_N, BLOCK_V]`` logit tile with the forward's own tile code (same accumulation order,
so ``p`` is consistent with the saved ``lse``), forms ``g_z`` and writes it rounded to the input
dtype (what autograd of a bf16 ``nn.Linear`` feeds its GEMMs) into an ``[N, columns]`` buffer
for one chunk of the vocabulary; two cuBLAS GEMMs then give ``grad_W[chunk] = g_z.T @ h`` (complete,
written once) and ``grad_h += g_z @ W[chunk]`` (fp32 accumulator ``[N, H]``). Why not atomics from
every tile into ``grad_h`` and ``grad_W`` (Cut Cross-Entropy's way): each ``grad_h`` element would
take ``V / BLOCK_V`` (1,187) atomic adds in an order that changes run to run — a mismatch lab
wants bitwise-repeatable gradients — while the buffered GEMMs are deterministic and run at
cuBLAS speed. Memory beyond the inputs and the gradients: the buffer (``GRAD_CHUNK_BYTES``), the
fp32 ``grad_h`` and ``[N]`` vectors; never ``[N, V]``, never an fp32 ``[V, H]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import compute_dtype
from .triton_common import block, compute_tl, native_dot, round_code, round_to

#: The backward's ``[N, columns]`` logit-gradient buffer (input dtype) stays under this. With the fp32
#: ``grad_h`` (32 MiB at N x H = 8192 x 1024) it keeps the backward's extra memory within issue 36's
#: 64 MiB goal at both card shapes; the chunk GEMMs stay wide (2,048 columns at N = 8192).
GRAD_CHUNK_BYTES = 32 << 20
#: Aim for this many forward programs (row blocks x vocabulary splits): 4 per SM of an H100.
TARGET_PROGRAMS = 528


@triton.jit
def _logit_tile(
    Hd, W, rows, rmask, vs, vmask, H, inv_temp,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    COMPUTE: tl.constexpr, LOGIT_ROUND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    """``round(h[rows] @ W[vs].T) / T`` as ``[BLOCK_N, BLOCK_V]``, ``-inf`` where ``vs >= V``."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], COMPUTE)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hmask = hs < H
        x = tl.load(Hd + rows[:, None] * H + hs[None, :], mask=rmask[:, None] & hmask[None, :], other=0.0)
        w = tl.load(W + vs.to(tl.int64)[:, None] * H + hs[None, :], mask=vmask[:, None] & hmask[None, :], other=0.0)
        if UPCAST:  # interpreter: 16-bit arithmetic is wrong there; compiled: fp32/fp64 inputs
            x = x.to(COMPUTE)
            w = w.to(COMPUTE)
        if IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee", out_dtype=COMPUTE)
        else:
            acc += tl.dot(x, tl.trans(w), out_dtype=COMPUTE)
    z = round_to(acc, LOGIT_ROUND).to(COMPUTE) * inv_temp
    return tl.where(vmask[None, :], z, -float("inf"))


@triton.jit
def _partials_kernel(
    Hd, W, T, PM, PS, PA, ZT,  # hidden[N, H], weight[V, H], targets[N]; partials m/s/a[S, N]; z_t[N]
    N, V, H, inv_temp, v_per_split,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    COMPUTE: tl.constexpr, LOGIT_ROUND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rmask = rows < N
    tgt = tl.load(T + rows, mask=rmask, other=-1)
    v_lo = split * v_per_split
    v_hi = tl.minimum(v_lo + v_per_split, V)
    m = tl.full([BLOCK_N], -float("inf"), COMPUTE)
    s = tl.zeros([BLOCK_N], COMPUTE)
    a = tl.zeros([BLOCK_N], COMPUTE)
    zt = tl.zeros([BLOCK_N], COMPUTE)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        vs = v0 + tl.arange(0, BLOCK_V)
        vmask = vs < v_hi
        z = _logit_tile(Hd, W, rows, rmask, vs, vmask, H, inv_temp,
                        BLOCK_N, BLOCK_V, BLOCK_H, COMPUTE, LOGIT_ROUND, UPCAST, IEEE)
        m_new = tl.maximum(m, tl.max(z, axis=1))
        shift = tl.where(vmask[None, :], z - m_new[:, None], 0.0)  # finite even in the masked tail
        e = tl.where(vmask[None, :], tl.exp(shift), 0.0)
        alpha = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
        moved = tl.where(s > 0, m - m_new, 0.0)  # avoids -inf * 0 before the first tile
        a = alpha * (a + moved * s) + tl.sum(e * shift, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        zt += tl.sum(tl.where(vs[None, :] == tgt[:, None], z, 0.0), axis=1)
        m = m_new
    out = split * N + rows
    tl.store(PM + out, m, mask=rmask)
    tl.store(PS + out, s, mask=rmask)
    tl.store(PA + out, a, mask=rmask)
    tl.store(ZT + rows, zt, mask=rmask & (tgt >= v_lo) & (tgt < v_hi))


@triton.jit
def _grad_logits_kernel(
    Hd, W, T, LSE, ENT, GLP, GENT, G,  # hidden[N, H], weight[V, H], targets/lse/entropy/grads[N]; out g_z[N, VC]
    N, V0, VC, H, inv_temp,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    COMPUTE: tl.constexpr, LOGIT_ROUND: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    G_ROUND: tl.constexpr,
):
    """``g_z`` for vocabulary columns ``[V0, V0 + VC)``, rounded to the input dtype."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)  # within the chunk
    rmask = rows < N
    vmask = cols < VC
    vs = V0 + cols
    z = _logit_tile(Hd, W, rows, rmask, vs, vmask, H, inv_temp,
                    BLOCK_N, BLOCK_V, BLOCK_H, COMPUTE, LOGIT_ROUND, UPCAST, IEEE)
    lse = tl.load(LSE + rows, mask=rmask, other=0.0)[:, None]
    ent = tl.load(ENT + rows, mask=rmask, other=0.0)[:, None]
    g_lp = tl.load(GLP + rows, mask=rmask, other=0.0)[:, None]
    g_ent = tl.load(GENT + rows, mask=rmask, other=0.0)[:, None]
    tgt = tl.load(T + rows, mask=rmask, other=-1)[:, None]
    logp = tl.where(vmask[None, :], z - lse, 0.0)
    p = tl.where(vmask[None, :], tl.exp(logp), 0.0)
    g = tl.where(vs[None, :] == tgt, g_lp, 0.0) - p * (g_lp + g_ent * (logp + ent))
    tile = rows[:, None] * VC + cols[None, :]
    tl.store(G + tile, round_to(g * inv_temp, G_ROUND), mask=rmask[:, None] & vmask[None, :])


def _config(hidden: torch.Tensor, vocab: int) -> dict:
    """Tile sizes and the dot flavour: tensor-core bf16/fp16 tiles compiled; the interpreter and
    fp32/float64 inputs upcast and use IEEE dots (no TF32: torch's fp32 matmul does not use it)."""
    n, hdim = hidden.shape
    upcast = not native_dot() or hidden.dtype in (torch.float32, torch.float64)
    if hidden.is_cpu:
        blocks = dict(BLOCK_N=16, BLOCK_V=block(min(vocab, 32)), BLOCK_H=block(min(hdim, 32)))
        launch = {}
    elif upcast:
        blocks = dict(BLOCK_N=min(64, block(n)), BLOCK_V=64, BLOCK_H=32)
        launch = dict(num_warps=4, num_stages=2)
    else:
        blocks = dict(BLOCK_N=min(128, block(n)), BLOCK_V=128, BLOCK_H=64)
        launch = dict(num_warps=8, num_stages=3)
    return dict(blocks, COMPUTE=compute_tl(compute_dtype(hidden.dtype)), LOGIT_ROUND=round_code(hidden.dtype),
                UPCAST=upcast, IEEE=upcast, **launch)


def forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprob[N], entropy[N], logsumexp[N])`` in fp32 (float64 for float64 inputs)."""
    n, hdim = hidden.shape
    vocab = weight.shape[0]
    compute = compute_dtype(hidden.dtype)
    if n == 0:
        empty = torch.empty(0, dtype=compute, device=hidden.device)
        return empty, empty.clone(), empty.clone()
    cfg = _config(hidden, vocab)
    row_blocks = triton.cdiv(n, cfg["BLOCK_N"])
    tiles = triton.cdiv(vocab, cfg["BLOCK_V"])
    target = 8 if hidden.is_cpu else TARGET_PROGRAMS  # the interpreter still merges several splits
    v_per_split = triton.cdiv(tiles, min(tiles, max(1, target // row_blocks))) * cfg["BLOCK_V"]
    splits = triton.cdiv(vocab, v_per_split)
    pm, ps, pa = (torch.empty(splits, n, dtype=compute, device=hidden.device) for _ in range(3))
    zt = torch.empty(n, dtype=compute, device=hidden.device)
    _partials_kernel[(row_blocks, splits)](
        hidden, weight, targets, pm, ps, pa, zt, n, vocab, hdim, 1.0 / temperature, v_per_split, **cfg)
    big_m = pm.max(dim=0).values  # [N]; finite unless a row is NaN
    scale = torch.exp(pm - big_m)  # [S, N]
    total_s = (scale * ps).sum(0)
    total_a = (scale * (pa + (pm - big_m) * ps)).sum(0)
    log_s = total_s.log()
    lse = big_m + log_s
    return zt - lse, log_s - total_a / total_s, lse


def grad_chunk_columns(n: int, vocab: int, itemsize: int, block_v: int, chunk_size: int | None) -> int:
    """Vocabulary columns of the backward's ``[N, columns]`` logit-gradient buffer: at most
    ``chunk_size * V`` elements (the torch ``chunked`` variant's ``[chunk_size, V]`` buffer) or, by
    default, ``GRAD_CHUNK_BYTES``; a multiple of the vocabulary tile when wider than one."""
    budget = chunk_size * vocab if chunk_size is not None else GRAD_CHUNK_BYTES // itemsize
    cols = min(vocab, max(1, budget // max(n, 1)))
    return cols - cols % block_v if cols > block_v else cols


class FusedLogprobs(torch.autograd.Function):
    """Triton forward and backward; saves only the inputs and three ``[N]`` vectors.

    The backward walks the vocabulary in column chunks (not row chunks): ``grad_W[chunk]`` is
    then one complete GEMM, written once in the weight's dtype with the rounding autograd of
    ``h @ W.T`` would give it, and the only accumulator is ``grad_h`` in fp32, ``[N, H]`` — small
    next to an fp32 ``[V, H]`` (1.2 GB at V = 151,936, H = 2048).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk_size: int | None):
        hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
        token_logp, entropy, lse = forward(hidden, weight, targets, temperature)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return token_logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, hdim = hidden.shape
        vocab = weight.shape[0]
        g_lp = torch.zeros_like(lse) if grad_logp is None else grad_logp.contiguous()
        g_ent = torch.zeros_like(lse) if grad_entropy is None else grad_entropy.contiguous()
        grad_h = torch.zeros(hidden.shape, dtype=lse.dtype, device=hidden.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        if n == 0:
            return grad_h.to(hidden.dtype) if need_h else None, grad_w.zero_() if need_w else None, None, None, None
        cfg = _config(hidden, vocab)
        cols = grad_chunk_columns(n, vocab, hidden.element_size(), cfg["BLOCK_V"], ctx.chunk_size)
        g_buf = torch.empty(n, cols, dtype=hidden.dtype, device=hidden.device)  # [N, cols]
        for v0 in range(0, vocab, cols):
            c = min(cols, vocab - v0)
            g = g_buf.view(-1)[: n * c].view(n, c)  # contiguous, the last chunk narrower
            _grad_logits_kernel[(triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(c, cfg["BLOCK_V"]))](
                hidden, weight, targets, lse, entropy, g_lp, g_ent, g,
                n, v0, c, hdim, 1.0 / ctx.temperature, G_ROUND=round_code(hidden.dtype), **cfg)
            if need_h:
                grad_h += g @ weight[v0:v0 + c]
            if need_w:
                torch.mm(g.T, hidden, out=grad_w[v0:v0 + c])
        return (grad_h.to(hidden.dtype) if need_h else None), grad_w, None, None, None
