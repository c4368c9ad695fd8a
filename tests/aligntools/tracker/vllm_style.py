"""A tiny Qwen3-MoE written the way vLLM/SGLang write it, loaded from a transformers model.

Same module paths as vLLM's ``Qwen3MoeForCausalLM`` (``model.layers.0.self_attn.qkv_proj``,
``rotary_emb``, ``mlp.gate``, ``logits_processor``) and the same conventions: flat
[tokens, ...] tensors, linear layers returning (out, bias), fused add+RMSNorm that writes its
inputs in place and returns (normed, residual), decoder layers returning (delta, residual),
in-place RoPE. Used to test the fused-engine adapter on CPU against the hf capture.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())

    def forward(self, x):
        return F.linear(x, self.weight), None


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(weight.detach().clone()), eps

    def _norm(self, x):
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def forward(self, x, residual=None):
        if residual is None:
            return self._norm(x)
        residual.add_(x)  # fused add+norm, in place on both buffers as vLLM's kernel does
        x.copy_(self._norm(residual))
        return x, residual


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)

    def forward(self, positions, q, k):
        freqs = positions.float()[:, None] * self.inv_freq[None]  # [T, D/2]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        for x in (q, k):
            xv = x.view(len(x), -1, self.head_dim)
            half = self.head_dim // 2
            rot = torch.cat([-xv[..., half:], xv[..., :half]], -1)
            xv.copy_(xv * cos + rot * sin)  # in place, as vLLM's rotary kernel
        return q, k


class Attention(nn.Module):
    def __init__(self, hf_attn, cfg) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        self.qkv_proj = Linear(torch.cat([hf_attn.q_proj.weight, hf_attn.k_proj.weight, hf_attn.v_proj.weight]))
        self.o_proj = Linear(hf_attn.o_proj.weight)
        self.q_norm = RMSNorm(hf_attn.q_norm.weight, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hf_attn.k_norm.weight, cfg.rms_norm_eps)
        self.rotary_emb = Rotary(cfg.head_dim, cfg.rope_parameters["rope_theta"])
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads

    def forward(self, positions, hidden, query_start_loc):
        qkv, _ = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
        d = self.head_dim
        q = self.q_norm(q.reshape(len(q), -1, d)).reshape(len(q), -1)
        k = self.k_norm(k.reshape(len(k), -1, d)).reshape(len(k), -1)
        q, k = self.rotary_emb(positions, q, k)
        out = torch.empty_like(q)
        for lo, hi in zip(query_start_loc[:-1].tolist(), query_start_loc[1:].tolist()):
            qh = q[lo:hi].view(hi - lo, -1, d).transpose(0, 1)
            kh = k[lo:hi].view(hi - lo, -1, d).transpose(0, 1).repeat_interleave(self.groups, 0)
            vh = v[lo:hi].reshape(hi - lo, -1, d).transpose(0, 1).repeat_interleave(self.groups, 0)
            out[lo:hi] = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(0, 1).reshape(hi - lo, -1)
        return self.o_proj(out)[0]


class Experts(nn.Module):
    def __init__(self, hf_experts) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(hf_experts.gate_up_proj.detach().clone())  # [E, 2I, H]
        self.down = nn.Parameter(hf_experts.down_proj.detach().clone())  # [E, H, I]

    def forward(self, x, logits, k):
        w, ids = torch.topk(torch.softmax(logits.float(), -1), k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(len(x)):
            for j in range(k):
                g, u = F.linear(x[t], self.gate_up[ids[t, j]]).chunk(2)
                out[t] += w[t, j] * F.linear(F.silu(g) * u, self.down[ids[t, j]])
        return out


class MoE(nn.Module):
    def __init__(self, hf_moe, cfg) -> None:
        super().__init__()
        self.gate = Linear(hf_moe.gate.weight)
        self.experts = Experts(hf_moe.experts)
        self.k = cfg.num_experts_per_tok

    def forward(self, x):
        logits, _ = self.gate(x)
        return self.experts(x, logits, self.k)


class DecoderLayer(nn.Module):
    def __init__(self, hf_layer, cfg) -> None:
        super().__init__()
        self.self_attn = Attention(hf_layer.self_attn, cfg)
        self.mlp = MoE(hf_layer.mlp, cfg)
        self.input_layernorm = RMSNorm(hf_layer.input_layernorm.weight, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hf_layer.post_attention_layernorm.weight, cfg.rms_norm_eps)

    def forward(self, positions, hidden, residual, query_start_loc):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, query_start_loc)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Model(nn.Module):
    def __init__(self, hf, cfg) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding.from_pretrained(hf.model.embed_tokens.weight.detach().clone())
        self.layers = nn.ModuleList(DecoderLayer(layer, cfg) for layer in hf.model.layers)
        self.norm = RMSNorm(hf.model.norm.weight, cfg.rms_norm_eps)

    def forward(self, input_ids, positions, query_start_loc):
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, query_start_loc)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LogitsProcessor(nn.Module):
    def forward(self, lm_head, hidden):
        return F.linear(hidden, lm_head.weight)


class Qwen3MoeForCausalLM(nn.Module):
    """``forward(input_ids [T], positions [T], query_start_loc [R+1]) -> hidden [T, H]``;
    ``compute_logits(hidden)`` as vLLM's model runner calls it."""

    def __init__(self, hf) -> None:
        super().__init__()
        self.config = hf.config
        self.model = Model(hf, hf.config)
        self.lm_head = Linear(hf.lm_head.weight)
        self.logits_processor = LogitsProcessor()

    def forward(self, input_ids, positions, query_start_loc):
        return self.model(input_ids, positions, query_start_loc)

    def compute_logits(self, hidden):
        return self.logits_processor(self.lm_head, hidden)
