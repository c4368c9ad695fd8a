"""Kimi delta attention (KDA), the linear attention of BailingHybrid (Ring-linear): a short causal
depthwise conv, then a per-head [dk, dv] state updated by a gated delta rule once per token.

Two forms of the same sums (``Knobs.linear_attention``). ``recurrent`` (``delta_rule``): the decode
kernel's math for prefill too, so prefill and decode agree by construction. ``chunked``
(``delta_rule_chunked``): transformers' prefill, chunks of 64 tokens, op for op. In fp32 they differ
by ~1e-7, and in a bf16 model that is enough to round some outputs to the other bf16 neighbour: on
tiny-ring-linear a 65-token bf16 score was 0.8 off transformers' in a log-prob with ``recurrent``,
bit for bit with ``chunked``. Decode (one token onto a cached state) is recurrent in both, as in
transformers. The state lives in the cache in ``kv_cache_dtype`` (Ring-linear 5.2.1 KV Cache: a bf16
recurrent state accumulates rounding error every step, an fp32 one does not); the update itself
always runs in fp32, as in transformers / FLA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
    """Depthwise causal conv + SiLU, as transformers' fallbacks compute it: x [B, C, S] (``past``
    [B, C, K-1], or None for a prefill from position 0) -> [B, C, S] in x.dtype, in the weight dtype
    (transformers keeps ``conv1d`` in fp32). A prefill pads inside the conv and takes SiLU of the
    sliced, strided output (``causal_conv1d_fn``); a decode step concatenates its window
    (``causal_conv1d_update``). Same layouts, same bits: SiLU of the same fp32 values laid out
    contiguously (zeros concatenated in front, as this did until 2026-12-08) took torch's other
    vectorised path for ~2 % of them, 1 ulp apart, and on an 11-token tiny-ring-linear rollout one
    of 4,224 then rounded to the other bf16 (1.2e-4 in a log-prob)."""
    k = weight.shape[-1]
    if past is None:
        out = F.conv1d(x.to(weight.dtype), weight, padding=k - 1, groups=x.shape[1])[..., :x.shape[-1]]  # [B, C, S]
    else:
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


FORMS = ("recurrent", "chunked")
"""``Knobs.linear_attention`` values: the prefill's form of the delta rule."""
CHUNK = 64
"""transformers' (and FLA's) KDA prefill chunk length."""


def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``delta_rule``'s sums in transformers' order (``chunk_kimi_delta_attention``'s torch path,
    transcribed op for op): within a chunk of ``CHUNK`` tokens a lower-triangular solve, across
    chunks the state. Same arguments and returns as ``delta_rule``. A row shorter than the batch
    (``lens``) has its tail zeroed, as transformers' own padding to a whole chunk is: zero keys,
    values, gates and betas leave the state as the row's last token left it. Memory: a
    [B, h, S/64, 64, 64, dk] decay tensor, as transformers builds."""
    dtype = q.dtype
    q, k, v, beta, g = (t.transpose(1, 2).contiguous().float() for t in (q, k, v, beta, g))  # [B, h, S, .]
    q, k = l2norm(q), l2norm(k)
    if lens is not None:
        keep = (torch.arange(q.shape[2], device=q.device) < lens[:, None])[:, None]  # [B, 1, S]
        q, k, v, g = (torch.where(keep[..., None], t, 0.0) for t in (q, k, v, g))
        beta = torch.where(keep, beta, 0.0)
    b, h, s, dk = k.shape
    pad = (CHUNK - s % CHUNK) % CHUNK
    q = F.pad(q, (0, 0, 0, pad)) * dk ** -0.5
    k, v, g = (F.pad(t, (0, 0, 0, pad)) for t in (k, v, g))
    beta = F.pad(beta, (0, pad))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, v, g, k_beta, v_beta = (t.reshape(b, h, -1, CHUNK, t.shape[-1]) for t in (q, k, v, g, k_beta, v_beta))
    g = g.cumsum(dim=-2)  # [B, h, n, C, dk]
    upper = torch.triu(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device), diagonal=0)
    strict = torch.triu(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device), diagonal=1)
    decay = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(strict[..., None], float("-inf")).exp().float()
    attn = -(k_beta.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(dim=-1).masked_fill(upper, 0)  # [B, h, n, C, C]
    for i in range(1, CHUNK):  # (I + A)^-1 by forward substitution, row by row
        row, sub = attn[..., i, :i].clone(), attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(CHUNK, dtype=attn.dtype, device=attn.device)
    v = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp())
    s_ = state.to(v)  # [B, h, dk, dv]
    out = torch.zeros_like(v)
    for i in range(v.shape[2]):
        q_i, k_i, v_i, g_i = q[:, :, i], k[:, :, i], v[:, :, i], g[:, :, i]
        inter = (q_i * g_i.exp()) @ s_
        intra = (q_i.unsqueeze(-2) * k_i.unsqueeze(-3) * decay[:, :, i]).sum(dim=-1).masked_fill(strict, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ s_
        out[:, :, i] = inter + intra @ v_new
        s_ = s_ * g_i[:, :, -1].exp().unsqueeze(-1) + (k_i * (g_i[:, :, -1:] - g_i).exp()).transpose(-1, -2) @ v_new
    out = out.reshape(b, h, -1, out.shape[-1])[:, :, :s].transpose(1, 2).contiguous()  # [B, S, h, dv]
    return out.to(dtype), s_
