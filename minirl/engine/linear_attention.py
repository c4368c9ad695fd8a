"""Kimi delta attention (KDA), the linear attention of BailingHybrid (Ring-linear), in its
recurrent form: a short causal depthwise conv, then a per-head [dk, dv] state updated by a
gated delta rule once per token.

Why the recurrent form for prefill too: it is the decode kernel's math, so prefill and decode
agree by construction; transformers' chunked prefill computes the same sums in another order
(fp32 differences ~1e-7). The state lives in the cache in ``kv_cache_dtype`` (Ring-linear 5.2.1
KV Cache: a bf16 recurrent state accumulates rounding error every step, an fp32 one does not);
the update itself always runs in fp32, as in transformers / FLA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
    """Depthwise causal conv + SiLU, as transformers' ``causal_conv1d_fn``/``_update`` fallbacks:
    x [B, C, S] (``past`` [B, C, K-1] or None = zeros) -> [B, C, S] in x.dtype. Computed in the
    weight dtype (transformers keeps ``conv1d`` in fp32)."""
    k = weight.shape[-1]
    if past is None:
        past = x.new_zeros(*x.shape[:2], k - 1)
    full = torch.cat((past.to(weight.dtype), x.to(weight.dtype)), dim=-1)  # [B, C, K-1+S]
    out = F.conv1d(full, weight, groups=x.shape[1])  # [B, C, S]
    return F.silu(out).to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """FLA's l2norm: ``x / sqrt(sum(x^2) + eps)`` (eps added, not clamped)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor, lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over S steps, all in fp32.

    q/k [B, S, h, dk], v [B, S, h, dv], g [B, S, h, dk] (log decay), beta [B, S, h], ``state``
    [B, h, dk, dv] -> (output [B, S, h, dv] in q.dtype, final state [B, h, dk, dv] fp32). With
    ``lens`` [B] (right-padded prefill) the final state of row b is the one after step
    ``lens[b] - 1``, so padding never enters the cache.
    """
    dtype = q.dtype
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    q, k = l2norm(q) * q.shape[-1] ** -0.5, l2norm(k)
    s = state.float()
    final = s.clone() if lens is not None else None
    out = torch.empty(*v.shape, dtype=torch.float32, device=v.device)  # [B, S, h, dv]
    for t in range(q.shape[1]):
        s = s * g[:, t, ..., None].exp()  # decay per key channel
        mem = (s * k[:, t, ..., None]).sum(dim=-2)  # [B, h, dv] what the state recalls for k_t
        delta = (v[:, t] - mem) * beta[:, t, ..., None]
        s = s + k[:, t, ..., None] * delta[..., None, :]
        out[:, t] = (s * q[:, t, ..., None]).sum(dim=-2)
        if final is not None:
            done = lens - 1 == t
            final[done] = s[done]
    return out.to(dtype), (s if final is None else final)
