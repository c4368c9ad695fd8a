"""BailingHybrid (Ring-linear / Ling): KDA linear-attention layers, MLA full-attention layers
with a head-wise output gate, and a sigmoid-routed MoE with a correction bias, expert groups,
shared experts and ``routed_scaling_factor``.

Why a ``Transformer`` subclass: the residual stream, norms, taps, lm_head and the expert
dispatch are the engine's own; only the two attention kinds, the router and the decode cache
(KV for MLA layers, conv + recurrent state for linear layers) differ.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from minirl.engine.attention import attention, pad_rows
from minirl.engine.batch import ForwardBatch
from minirl.engine.archs import Arch
from minirl.engine.archs.softmax_moe import expert_recipes
from minirl.engine.config import HybridSpec, ModelSpec, eos_token_ids, mlp_act, rope_theta
from minirl.engine.knobs import Knobs
from minirl.engine.kv_cache import KVCache
from minirl.engine.linear_attention import causal_conv, delta_rule, delta_rule_chunked
from minirl.engine.model import LayerWeights, Transformer
from minirl.engine.moe import emit_routing, experts_forward
from minirl.engine.ops import row_parallel_linear
from minirl.engine.weight_map import Layout, Recipe, cat, one

FP32_WEIGHTS = (".conv", ".dt_bias", ".A_log", ".router_bias")
"""transformers' ``_keep_in_fp32_modules_strict``: these stay fp32 in any activation dtype."""


def bailing_spec(cfg: dict) -> ModelSpec:
    """BailingHybrid config.json -> ModelSpec (HF attribute_map spellings resolved here)."""
    n_heads, qk_rope = cfg["num_attention_heads"], cfg["qk_rope_head_dim"]
    if cfg.get("head_dim", qk_rope) != qk_rope:
        raise ValueError(f"BailingHybrid head_dim={cfg['head_dim']} != qk_rope_head_dim={qk_rope}: "
                         f"transformers builds the RoPE table from head_dim; only equal sizes are supported")
    if cfg.get("attention_bias"):
        raise ValueError("BailingHybrid attention_bias=true is not supported")
    if mlp_act(cfg) != "silu":
        raise ValueError(f"BailingHybrid hidden_act {cfg['hidden_act']!r} is not supported (SwiGLU with silu only)")
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % cfg.get("layer_group_size", 6) == 0
                                       else "linear_attention" for i in range(n)]
    mlp_types = cfg.get("mlp_layer_types") or ["dense" if i < cfg.get("first_k_dense_replace", 2) else "sparse"
                                               for i in range(n)]
    moe_size = cfg["moe_intermediate_size"]
    hybrid = HybridSpec(
        layer_types=tuple(types), linear_heads=cfg.get("linear_num_heads", n_heads),
        linear_head_dim=cfg.get("linear_head_dim", cfg.get("head_dim", qk_rope)),
        conv_kernel=cfg.get("linear_conv_kernel_dim", cfg.get("short_conv_kernel_size", 4)),
        safe_gate=bool(cfg.get("kda_safe_gate", True)), gate_lower_bound=float(cfg.get("kda_lower_bound", -5.0)),
        kv_lora_rank=cfg["kv_lora_rank"], qk_nope_dim=cfg["qk_nope_head_dim"], qk_rope_dim=qk_rope,
        v_head_dim=cfg["v_head_dim"], n_group=cfg.get("num_expert_group", cfg.get("n_group", 1)),
        topk_group=cfg.get("topk_group", 1), routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
        shared_intermediate_size=moe_size * cfg.get("num_shared_experts", cfg.get("n_shared_experts", 1)))
    return ModelSpec(
        arch="bailing_hybrid", vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], n_layers=n,
        n_heads=n_heads, n_kv_heads=n_heads, head_dim=hybrid.qk_nope_dim + qk_rope,
        intermediate_size=cfg["intermediate_size"], rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta(cfg), rotary_dim=qk_rope,
        max_positions=cfg.get("model_max_length") or cfg["max_position_embeddings"],
        qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        eos_token_ids=eos_token_ids(cfg),
        moe_layers=tuple(i for i, t in enumerate(mlp_types) if t == "sparse"),
        n_experts=cfg.get("num_experts") or cfg["num_local_experts"],
        top_k=cfg.get("num_experts_per_token") or cfg["num_experts_per_tok"], moe_intermediate_size=moe_size,
        renormalize=bool(cfg.get("moe_renormalize", cfg.get("norm_topk_prob", True))),
        topk_weights_in_logits_dtype=False, hybrid=hybrid)


# ---------------------------------------------------------------------- weights
def bailing_recipes(spec: ModelSpec) -> list[Recipe]:
    """Engine tensors from either the on-disk names (``attention.dense``, ``q_conv1d``,
    ``word_embeddings``, ``expert_bias``) or transformers' in-memory ones (``self_attn.o_proj``,
    packed ``conv1d``, ``embed_tokens``, ``e_score_correction_bias``)."""
    hs = spec.hybrid
    assert hs is not None
    h, v = spec.hidden_size, spec.vocab_size

    def alt(target: str, names: tuple[str, str], shape: tuple[int, ...]) -> Recipe:
        return Recipe(target, tuple(Layout(((n, shape),), one) for n in names))

    def fused(target: str, parts: list[tuple[tuple[str, str], tuple[int, ...]]]) -> Recipe:
        return Recipe(target, tuple(Layout(tuple((names[j], shape) for names, shape in parts), cat)
                                    for j in range(2)))

    out = [alt("embed", ("model.word_embeddings.weight", "model.embed_tokens.weight"), (v, h)),
           alt("final_norm", ("model.norm.weight", "model.norm.weight"), (h,))]
    if not spec.tie_word_embeddings:
        out.append(alt("lm_head", ("lm_head.weight", "lm_head.weight"), (v, h)))
    for i, kind in enumerate(hs.layer_types):
        p, t = f"model.layers.{i}.", f"L{i}."
        disk, mem = p + "attention.", p + "self_attn."

        def both(name: str, mem_name: str | None = None) -> tuple[str, str]:
            return disk + name, mem + (mem_name or name)

        out += [alt(t + "attn_norm", (p + "input_layernorm.weight",) * 2, (h,)),
                alt(t + "mlp_norm", (p + "post_attention_layernorm.weight",) * 2, (h,))]
        if kind == "linear_attention":
            d, nh, k = hs.linear_heads * hs.linear_head_dim, hs.linear_heads, hs.conv_kernel
            out += [fused(t + "qkv", [(both(f"{x}_proj.weight"), (d, h)) for x in "qkv"]),
                    Recipe(t + "conv", (Layout(tuple((disk + f"{x}_conv1d.weight", (d, 1, k)) for x in "qkv"), cat),
                                        Layout(((mem + "conv1d.weight", (3 * d, 1, k)),), one))),
                    alt(t + "f_proj", both("f_proj.weight", "forget_gate.f_proj.weight"), (d, h)),
                    alt(t + "dt_bias", both("dt_bias", "forget_gate.dt_bias"), (d,)),
                    alt(t + "A_log", both("A_log", "forget_gate.A_log"), (nh,)),
                    alt(t + "b_proj", both("b_proj.weight"), (nh, h)),
                    alt(t + "g_proj", both("g_proj.weight"), (d, h)),
                    alt(t + "o_norm", both("o_norm.weight"), (hs.linear_head_dim,)),
                    alt(t + "o", both("dense.weight", "o_proj.weight"), (h, d))]
        else:
            nh, r = spec.n_heads, hs.kv_lora_rank
            out += [alt(t + "q", both("q_proj.weight"), (nh * spec.head_dim, h)),
                    alt(t + "kv_a", both("kv_a_proj_with_mqa.weight"), (r + hs.qk_rope_dim, h)),
                    alt(t + "kv_a_norm", both("kv_a_layernorm.weight"), (r,)),
                    alt(t + "kv_b", both("kv_b_proj.weight"), (nh * (hs.qk_nope_dim + hs.v_head_dim), r)),
                    alt(t + "g_proj", both("g_proj.weight"), (nh, h)),
                    alt(t + "o", both("dense.weight", "o_proj.weight"), (h, nh * hs.v_head_dim))]
        m = p + "mlp."
        if spec.is_moe(i):
            s, si = m + "shared_experts.", hs.shared_intermediate_size
            out += expert_recipes(spec, i)
            out += [alt(t + "router_bias", (m + "gate.expert_bias", m + "gate.e_score_correction_bias"),
                        (spec.n_experts,)),
                    fused(t + "shared_gate_up", [((s + "gate_proj.weight",) * 2, (si, h)),
                                               ((s + "up_proj.weight",) * 2, (si, h))]),
                    alt(t + "shared_down", (s + "down_proj.weight",) * 2, (h, si))]
        else:
            n = spec.intermediate_size
            out += [fused(t + "gate_up", [((m + "gate_proj.weight",) * 2, (n, h)), ((m + "up_proj.weight",) * 2, (n, h))]),
                    alt(t + "down", (m + "down_proj.weight",) * 2, (h, n))]
    return out


# ---------------------------------------------------------------------- cache
class HybridCache(KVCache):
    """KV cache of the MLA layers (expanded per-head K [.., qk_dim] and V [.., v_dim], indexed by
    full-attention layer) plus, per linear layer, the conv window [rows, 3D, K-1] and the
    recurrent state [rows, h, dk, dv], all in the cache dtype."""

    def __init__(self, spec: ModelSpec, rows: int, capacity: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        hs = spec.hybrid
        assert hs is not None
        super().__init__(len(hs.full_layers), rows, capacity, spec.n_heads, spec.head_dim, dtype, device,
                         v_head_dim=hs.v_head_dim)
        n_lin, dk = len(hs.layer_types) - len(hs.full_layers), hs.linear_head_dim
        self.conv = [torch.zeros(rows, 3 * hs.linear_heads * dk, hs.conv_kernel - 1, dtype=dtype, device=device)
                     for _ in range(n_lin)]
        self.state = [torch.zeros(rows, hs.linear_heads, dk, dk, dtype=dtype, device=device) for _ in range(n_lin)]

    def buffers(self) -> list[torch.Tensor]:
        return [*super().buffers(), *self.conv, *self.state]


# ---------------------------------------------------------------------- model
class BailingTransformer(Transformer):
    """The engine forward with BailingHybrid's attention kinds and router."""

    def __init__(self, spec: ModelSpec, knobs: Knobs, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(spec, knobs, dtype, device)
        assert spec.hybrid is not None
        self.hs = spec.hybrid
        # per-kind index of each layer into the cache's full-attention / linear lists
        kinds = self.hs.layer_types
        self.slot = [kinds[:i].count(kinds[i]) for i in range(len(kinds))]

    def _store_dtype(self, name: str) -> torch.dtype:
        # the router too: transformers' BailingHybridTopkRouter runs F.linear on fp32 copies of the input and of
        # its (model-dtype) weight whatever the model dtype, so ``Knobs.router_dtype`` does not apply here
        return torch.float32 if name.endswith((*FP32_WEIGHTS, ".router")) else super()._store_dtype(name)

    def _round_dtype(self, name: str) -> torch.dtype:
        # transformers keeps these exact (``_keep_in_fp32_modules_strict``): never round them.
        return torch.float32 if name.endswith(FP32_WEIGHTS) else super()._round_dtype(name)

    def _quantized(self, name: str, t: torch.Tensor) -> bool:
        return not name.endswith(FP32_WEIGHTS) and super()._quantized(name, t)

    def new_cache(self, rows: int, capacity: int, dtype: torch.dtype) -> HybridCache:
        return HybridCache(self.spec, rows, capacity, dtype, self.device)

    def _attention(self, x: torch.Tensor, lw: LayerWeights, batch: ForwardBatch, cache: KVCache | None,
                   i: int, emit: Callable | None, p: str) -> torch.Tensor:
        if self.hs.layer_types[i] == "linear_attention":
            return self._linear_attention(x, batch, cache, i, emit, p)
        return self._mla(x, batch, cache, i, emit, p)

    def _mla(self, x: torch.Tensor, batch: ForwardBatch, cache: KVCache | None, i: int,
             emit: Callable | None, p: str) -> torch.Tensor:
        """Multi-head latent attention, K/V expanded per head before caching, output gated per
        head by ``sigmoid(g_proj(x))``. RoPE is DeepSeek's interleaved pairs, computed as neox
        on the de-interleaved dims, which is transformers' output layout exactly."""
        hs, w, n, h = self.hs, self.w, x.shape[0], self.spec.n_heads
        nope, rope_d, r = hs.qk_nope_dim, hs.qk_rope_dim, hs.kv_lora_rank
        q = F.linear(x, w[p + "q"]).view(n, h, nope + rope_d)  # [N, h, qk]
        kv_a = F.linear(x, w[p + "kv_a"])  # [N, r + rope]
        latent = self.norm(kv_a[:, :r], w[p + "kv_a_norm"], self.kv_eps)  # [N, r]
        rot = torch.cat((q[..., nope:], kv_a[:, None, r:]), dim=1)  # [N, h + 1, rope]
        rot = self.apply_rope(torch.cat((rot[..., 0::2], rot[..., 1::2]), dim=-1), batch)
        kv = F.linear(latent, w[p + "kv_b"]).view(n, h, nope + hs.v_head_dim)
        q = torch.cat((q[..., :nope], rot[:, :h]), dim=-1)  # [N, h, qk]
        k = torch.cat((kv[..., :nope], rot[:, h:].expand(n, h, rope_d)), dim=-1)  # [N, h, qk]
        v = kv[..., nope:]  # [N, h, dv]
        if emit:
            emit(p + "q", q.reshape(n, -1))
            emit(p + "k", k.reshape(n, -1))
            emit(p + "v", v.reshape(n, -1))
        o = attention(q, k, v.contiguous(), batch, cache, self.slot[i], self.knobs.attention, self.scale)
        gate = torch.sigmoid(F.linear(x, w[p + "g_proj"]).float()).to(x.dtype)  # [N, h]
        o = (o.view(n, h, -1) * gate[..., None]).reshape(n, -1)
        return row_parallel_linear(o, w[p + "o"], None, self.knobs.tp)

    def _linear_attention(self, x: torch.Tensor, batch: ForwardBatch, cache: KVCache | None, i: int,
                          emit: Callable | None, p: str) -> torch.Tensor:
        """KDA: fused q/k/v GEMM -> causal conv + SiLU -> gated delta rule -> gated RMSNorm -> o.
        Prefill pads to [B, S] and (with a cache) stores each row's conv window and final state;
        decode runs one step from the cached ones."""
        hs, w, n = self.hs, self.w, x.shape[0]
        nh, dk, k_size = hs.linear_heads, hs.linear_head_dim, hs.conv_kernel
        qkv = F.linear(x, w[p + "qkv"])  # [N, 3D]
        j = self.slot[i]
        if batch.decode:
            assert isinstance(cache, HybridCache)
            rows = batch.cache_rows
            window = cache.conv[j][rows]  # [B, 3D, K-1]
            mixed = causal_conv(qkv[:, :, None], w[p + "conv"], window)[:, :, 0]  # [N, 3D]
            cache.conv[j][rows] = torch.cat((window[..., 1:], qkv[:, :, None].to(cache.dtype)), dim=-1)
            padded, state, lens = mixed[:, None], cache.state[j][rows], None  # [B, 1, 3D]
        else:
            b, s = batch.n_seqs, batch.max_len
            xp = pad_rows(qkv, batch, b, s).transpose(1, 2)  # [B, 3D, S]
            padded = causal_conv(xp, w[p + "conv"], None).transpose(1, 2)  # [B, S, 3D]
            lens = torch.tensor(batch.seq_lens, device=x.device)
            state = torch.zeros(b, nh, dk, dk, device=x.device)
            if cache is not None:
                assert isinstance(cache, HybridCache)
                tail = F.pad(xp, (k_size - 1, 0))  # [B, 3D, K-1+S]: window ends at each row's length
                idx = lens[:, None] + torch.arange(k_size - 1, device=x.device)  # [B, K-1]
                cache.conv[j][batch.cache_rows] = tail.gather(
                    2, idx[:, None, :].expand(b, tail.shape[1], k_size - 1)).to(cache.dtype)
        q, k, v = (t.reshape(*padded.shape[:2], nh, dk) for t in padded.chunk(3, dim=-1))  # [B, S, h, dk]
        if emit:
            for name, t in (("q", q), ("k", k), ("v", v)):
                emit(p + name, _unpad(t.reshape(*t.shape[:2], -1), batch))
        xs = pad_rows(x, batch, *q.shape[:2]) if not batch.decode else x[:, None]  # [B, S, H]
        g = self._forget_gate(xs, p)  # [B, S, h, dk]
        beta = torch.sigmoid(F.linear(xs, w[p + "b_proj"]))  # [B, S, h]
        chunked = not batch.decode and self.knobs.linear_attention == "chunked"
        o, final = (delta_rule_chunked if chunked else delta_rule)(q, k, v, g, beta, state, lens)  # [B, S, h, dv]
        if cache is not None:
            assert isinstance(cache, HybridCache)
            cache.state[j][batch.cache_rows] = final.to(cache.dtype)
        o = _unpad(o.reshape(*o.shape[:2], -1), batch).view(n, nh, dk)  # [N, h, dv]
        o = self._gated_norm(o, F.linear(x, w[p + "g_proj"]).view(n, nh, dk), w[p + "o_norm"])
        return row_parallel_linear(o.reshape(n, -1), w[p + "o"], None, self.knobs.tp)

    def _forget_gate(self, x: torch.Tensor, p: str) -> torch.Tensor:
        """KDA log-decay per key channel, [.., H] -> [.., h, dk] in x.dtype (fp32 math, as HF)."""
        hs, w = self.hs, self.w
        f = F.linear(x, w[p + "f_proj"]).float().unflatten(-1, (hs.linear_heads, hs.linear_head_dim))
        f = f + w[p + "dt_bias"].view(hs.linear_heads, hs.linear_head_dim)
        rate = w[p + "A_log"].exp()[:, None]  # [h, 1]
        g = hs.gate_lower_bound * torch.sigmoid(rate * f) if hs.safe_gate else -rate * F.softplus(f)
        return g.to(x.dtype)

    def _gated_norm(self, o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' RMSNormGated: fp32 RMSNorm over dv, fp32 weight, ``* sigmoid(gate)``."""
        y = o.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (weight.float() * y * torch.sigmoid(gate.float())).to(o.dtype)

    def _mlp(self, x: torch.Tensor, lw: LayerWeights, emit: Callable | None, p: str, static: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if lw.router is None:
            return super()._mlp(x, lw, emit, p, static)
        ids, weights, logits = self._route(x, lw.router, self.w[p + "router_bias"])
        if emit:
            emit_routing(emit, p, logits, ids, weights)
        routed = experts_forward(x, ids, weights, lw.experts_gate_up, lw.experts_down, self.moe_cfg, static)
        shared = self._dense_mlp(x, self.w[p + "shared_gate_up"], None, self.w[p + "shared_down"], None)
        return routed + shared, ids

    def _route(self, x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """transformers' BailingHybridTopkRouter: sigmoid scores; the bias only steers selection
        (group by the sum of each group's top-2, then top-k among kept groups); weights are the
        unbiased scores, renormalised, times ``routed_scaling_factor``.
        x [N, H] -> (ids [N, k] by descending biased score, weights [N, k] fp32, logits [N, E])."""
        hs, e = self.hs, self.spec.n_experts
        logits = F.linear(x.float(), router)  # [N, E] fp32, as transformers computes it (see _store_dtype)
        scores = logits.sigmoid()
        choice = scores + bias
        groups = choice.view(-1, hs.n_group, e // hs.n_group)  # [N, G, E/G]
        top_groups = groups.topk(2, dim=-1)[0].sum(-1).topk(hs.topk_group, dim=-1)[1]  # [N, topk_group]
        keep = torch.zeros_like(groups[..., 0]).scatter_(1, top_groups, 1).bool()  # [N, G]
        choice = choice.masked_fill(~keep[..., None].expand_as(groups).reshape(-1, e), float("-inf"))
        ids = choice.topk(self.spec.top_k, dim=-1)[1]  # [N, k]
        weights = scores.gather(1, ids)
        if self.spec.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, weights * hs.routed_scaling_factor, logits

    @property
    def kv_eps(self) -> float:
        """kv_a_layernorm is built with transformers' default eps (1e-6), not the config's."""
        return 1e-6 if self.knobs.rmsnorm_eps is None else self.knobs.rmsnorm_eps



def _unpad(t: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """[B, S, ...] -> flat [N, ...] over valid tokens (decode: S = 1)."""
    flat = t.reshape(-1, *t.shape[2:])
    return flat if batch.pad_index is None else flat[batch.pad_index]


ARCH = Arch(spec=bailing_spec, recipes=bailing_recipes, model=BailingTransformer)
