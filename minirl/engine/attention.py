"""Causal GQA attention over the flat token layout: batched prefill and KV-cache decode.

Two backends (Ring-linear 5.2.1 Attention: "the used backend must be consistent"):
``sdpa`` is torch's fused scaled_dot_product_attention, what an engine's flash kernel stands
for; ``eager`` is transformers' ``eager_attention_forward`` math (scores in the activation
dtype, additive mask, softmax in fp32 cast back, then ``@ V``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minirl.engine.batch import ForwardBatch
from minirl.engine.kv_cache import KVCache

BACKENDS = ("sdpa", "eager")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
              cache: KVCache | None, layer: int, backend: str, scale: float, *,
              window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q/k [N, h|kv, d], v [N, kv, dv] (after RoPE) -> attention output [N, h * dv].

    Prefill attends over the fresh k/v (and writes them to the cache); decode writes the new
    token's k/v, then attends over the cached prefix, as inference engines do. ``window``: a
    query sees the keys less than ``window`` positions back (sliding-window layers; the cache
    keeps every position, the mask hides the old ones). ``softcap``: scores become
    ``tanh(s / cap) * cap`` before the mask (Gemma 2).
    """
    (n, h, d), dv = q.shape, v.shape[-1]
    if cache is not None:
        cache.write(layer, batch, k, v)
    if batch.decode:
        assert cache is not None
        kc, vc = cache.read(layer, batch.cache_rows, batch.max_context, q.dtype)  # [B, kv, L, d]
        mask = batch.decode_mask  # [B, 1, 1, L] or None
        if window is not None:
            lens, seen = batch.context_lens, torch.arange(batch.max_context, device=q.device)
            mask = ((seen < lens[:, None]) & (seen >= lens[:, None] - window))[:, None, None, :]
        if backend == "sdpa" and softcap is None:
            # GQA packing (FlashInfer / flash-decoding): the query heads sharing a KV head are
            # the query rows of one [rep, L] problem, so no KV head is read twice.
            kv = kc.shape[1]
            out = F.scaled_dot_product_attention(q.view(n, kv, h // kv, d), kc, vc, attn_mask=mask,
                                                 scale=scale)  # [B, kv, rep, d]
            return out.reshape(n, h * dv)
        out = _attend(q[:, :, None, :], kc, vc, mask, causal=False, backend=backend, scale=scale,
                      softcap=softcap)
        return out.reshape(n, h * dv)  # [B, 1, h, dv] -> [N, h*dv]
    b, s = batch.n_seqs, batch.max_len
    qp, kp, vp = (pad_rows(t, batch, b, s).transpose(1, 2) for t in (q, k, v))  # [B, heads, S, d]
    mask = None
    if window is not None:  # causal AND transformers' sliding_window_overlay
        pos = torch.arange(s, device=q.device)
        mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)  # [S, S]
    out = _attend(qp, kp, vp, mask, causal=mask is None, backend=backend, scale=scale,
                  softcap=softcap)  # [B, S, h, d]
    out = out.reshape(b * s, h * dv)
    return out if batch.pad_index is None else out[batch.pad_index]


def pad_rows(t: torch.Tensor, batch: ForwardBatch, b: int, s: int) -> torch.Tensor:
    """Flat [N, ...] -> right-padded [B, S, ...] (zeros past each row's length)."""
    if batch.pad_index is None:  # equal lengths: the flat layout already is [B, S]
        return t.reshape(b, s, *t.shape[1:])
    out = t.new_zeros(b * s, *t.shape[1:])
    out[batch.pad_index] = t
    return out.view(b, s, *t.shape[1:])


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
            causal: bool, backend: str, scale: float, softcap: float | None = None) -> torch.Tensor:
    """q [B, h, Sq, d], k/v [B, kv, Sk, d], bool ``mask`` broadcastable to [B, h, Sq, Sk]
    (True = attend) -> [B, Sq, h, d]. ``causal`` assumes Sq == Sk.

    A soft-capped ``sdpa`` has no torch kernel; it computes what a flash kernel with a softcap
    does (vLLM's FlashAttention ``logits_soft_cap``): scores, cap and softmax in fp32, one
    rounding of the output. ``eager`` is transformers' math, softcap included."""
    if backend == "sdpa" and softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # transformers' repeat_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    compute = q.dtype if backend == "eager" else torch.float32
    scores = torch.matmul(q.to(compute), k.to(compute).transpose(2, 3)) * scale  # [B, h, Sq, Sk]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if causal:
        sq, sk = scores.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores + torch.zeros(mask.shape, dtype=scores.dtype, device=q.device).masked_fill(
            ~mask, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(compute)
    return torch.matmul(probs, v.to(compute)).to(q.dtype).transpose(1, 2)
