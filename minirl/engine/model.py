"""The decoder forward the way inference engines compute it, with every numeric a knob.

Layout per layer (vLLM style): fused ``qkv`` GEMM -> [QK-norm] -> RoPE -> attention -> o_proj
-> fused add+RMSNorm -> fused ``gate_up`` GEMM -> SwiGLU -> down (or the MoE block) -> the next
layer's fused add+RMSNorm. The residual stream only exists inside the fused norm calls, so
the taps emit the residual those calls produce (``resid_mid``/``resid_post``), un-fused.

Weights, the RoPE table and every tensor a forward allocates live on ``device`` (the engine's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from kernels.rope import cos_sin_table, rotate
from minirl.engine.attention import attention
from minirl.engine.batch import ForwardBatch
from minirl.engine.config import ModelSpec
from minirl.engine.kv_cache import KVCache
from minirl.engine.knobs import Knobs
from minirl.engine.moe import MoEConfig, moe_forward
from minirl.engine.ops import act_mul, resolve_dtype, row_parallel_linear
from minirl.engine.prepack import PrepackedLinear
from minirl.engine.quantize import fake_quantize, fake_quantize_activations, unfit


@dataclass
class LayerWeights:
    """References into the weight dict (load_weights copies in place, so they stay valid)."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    gate_up: torch.Tensor | None
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor | None
    down_bias: torch.Tensor | None
    router: torch.Tensor | None
    experts_gate_up: torch.Tensor | None
    experts_down: torch.Tensor | None
    up: torch.Tensor | None  # a non-gated MLP's up projection (Arcee)
    up_bias: torch.Tensor | None
    post_attn_norm: torch.Tensor | None  # sandwich norms (Gemma 2/3)
    post_mlp_norm: torch.Tensor | None
    shared_gate_up: torch.Tensor | None  # Qwen2-MoE's shared expert and its sigmoid gate
    shared_down: torch.Tensor | None
    shared_gate: torch.Tensor | None


NORMS = ("attn_norm", "mlp_norm", "final_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")
"""Engine names of the RMSNorm weights (a family with ``norm_offset`` stores them as ``1 + w``)."""


class Transformer:
    """Weights in the fused layout + the forward pass. Holds no per-request state."""

    def __init__(self, spec: ModelSpec, knobs: Knobs, dtype: torch.dtype, device: torch.device) -> None:
        self.spec, self.knobs, self.dtype, self.device = spec, knobs, dtype, device
        self.unquantized: dict[str, str] = {}  # weight name -> why Knobs.weights could not apply to it
        self.weight_dtype = resolve_dtype(knobs.weight_dtype, dtype)
        self.lm_head_dtype = resolve_dtype(knobs.lm_head_dtype, dtype)
        self.router_dtype = resolve_dtype(knobs.router_dtype, dtype)
        self.eps = spec.rms_norm_eps if knobs.rmsnorm_eps is None else knobs.rmsnorm_eps
        kernel = kernels.get("rmsnorm", knobs.rmsnorm)
        self.norm = _offset_norm(kernel) if spec.norm_offset else kernel
        self.rope = kernels.get("rope", knobs.rope)
        self.rope_kw: dict = dict(rotary_dim=spec.rotary_dim, style="neox")
        self.thetas = sorted({spec.theta(i) for i in range(spec.n_layers)} - {None} | {spec.rope_theta})
        self.rope_tables: dict[float, torch.Tensor] = {}  # theta -> [max_positions, rotary_dim] (cached_table)
        if knobs.rope == "cached_table":
            self.rope_kw["cache_dtype"] = resolve_dtype(knobs.rope_cache_dtype, dtype)
            self._build_rope_table()
        # Gemma's sqrt(hidden) factor, rounded to the model dtype as transformers' buffer is
        self.embed_scale = None if spec.embed_scale is None else float(torch.tensor(spec.embed_scale).to(dtype))
        self.act_quant = self._activation_quantizer()
        self.moe_cfg = MoEConfig(
            top_k=spec.top_k, renormalize=spec.renormalize,
            weights_in_logits_dtype=spec.topk_weights_in_logits_dtype, router_dtype=self.router_dtype,
            topk_fn=kernels.get("router_topk", knobs.topk), sum_order=knobs.expert_sum_order,
            activation=knobs.activation, tp=knobs.tp, act_quant=self.act_quant)
        self.scale = spec.head_dim ** -0.5 if spec.attn_scale is None else spec.attn_scale
        self.w: dict[str, torch.Tensor] = {}
        self.layers: list[LayerWeights] = []
        # CPU bf16: weights packed once (native bf16) or fp32 GEMMs (prepack.py); transformers' math (aligned,
        # hf_exact) keeps torch's bf16 GEMM, the one a stock trainer runs, so it stays bit for bit
        self.linear = PrepackedLinear(exact=knobs.rmsnorm == "hf" and knobs.activation == "hf")

    @classmethod
    def quantizes_activations(cls) -> bool:
        """Whether ``Knobs.activations`` reaches every linear layer: only this class's qkv / o /
        gate_up / down / expert GEMMs call the quantizer, so an architecture with its own
        attention has linear layers it would miss (and refuses the knob rather than half-apply)."""
        return cls._attention is Transformer._attention

    def _activation_quantizer(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``Knobs.activations`` as a function on a linear layer's input, or None when off."""
        fmt = self.knobs.activations
        if fmt == "none":
            return None
        if not self.quantizes_activations():
            raise ValueError(f"knob activations={fmt!r} is implemented for the llama/qwen layer layout, "
                             f"not {type(self).__name__}'s own attention; use activations='none'")
        return lambda x: fake_quantize_activations(x, fmt)

    def _quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """A column-parallel GEMM's input as the quantized kernel reads it (unchanged when off)."""
        return x if self.act_quant is None else self.act_quant(x)

    # ------------------------------------------------------------------ weights
    def _store_dtype(self, name: str) -> torch.dtype:
        if name == "lm_head":
            return self.lm_head_dtype
        if name.endswith(".router"):
            return self.router_dtype
        if self.spec.norm_offset and name.rpartition(".")[2] in NORMS:
            return torch.float32  # ``1 + w`` in fp32, as Gemma's norms compute it
        return self.dtype

    def load(self, fused: dict[str, torch.Tensor]) -> None:
        """Take fused tensors (any dtype, any device): round to the weight dtype, store in the
        compute dtype on the engine's device.

        First call allocates; later calls copy in place (cheap weight sync, stable references,
        so captured CUDA graphs stay valid). Rounding runs where the tensor lives and ``copy_``
        goes device to device: a trainer on the GPU syncs without a trip through host memory.
        """
        self.linear.clear()
        with torch.no_grad():
            if not self.w:
                self.w = {n: self._rounded(n, t).to(device=self.device, dtype=self._store_dtype(n),
                                                    copy=True).contiguous()
                          for n, t in fused.items()}
                self.layers = [self._layer(i) for i in range(self.spec.n_layers)]
                return
            for n, t in fused.items():
                self.w[n].copy_(self._rounded(n, t))

    def to(self, device: torch.device) -> None:
        """Move the weights and the RoPE table to ``device`` (tied tensors stay one tensor)."""
        moved: dict[int, torch.Tensor] = {}
        self.linear.clear()
        self.w = {n: moved.setdefault(id(t), t.to(device)) for n, t in self.w.items()}
        self.layers = [self._layer(i) for i in range(self.spec.n_layers)]
        self.device = device
        if self.rope_tables:
            self._build_rope_table()

    def _build_rope_table(self) -> None:
        """vLLM's ``cos_sin_cache`` (one per RoPE base) for every position the model has, on the
        engine's device: the static (CUDA-graph) decode reads it without asking how far the
        positions reach."""
        self.rope_tables = {theta: cos_sin_table(theta, self.spec.rotary_dim, self.rope_kw["cache_dtype"],
                                                 self.device, self.spec.max_positions) for theta in self.thetas}

    def _rounded(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the engine uses it: quantized and dequantized (``Knobs.weights``) when it is
        a linear layer's weight, then rounded to the weight dtype."""
        if self.knobs.weights != "none" and self._quantized(name, t):
            why = unfit(self.knobs.weights, t.shape)
            if why is None:
                t = fake_quantize(t, self.knobs.weights, name)
            else:  # kept in full precision and listed, as llama.cpp keeps a tensor no block fits
                self.unquantized[name] = why
        t = t.to(self._round_dtype(name))
        if self.spec.norm_offset and name.rpartition(".")[2] in NORMS:
            return 1.0 + t.float()  # the checkpoint's w, rounded like any weight, then Gemma's 1 + w
        return t

    def _quantized(self, name: str, t: torch.Tensor) -> bool:
        """Whether ``Knobs.weights`` applies: every matrix inside a layer but the MoE router (vLLM
        keeps the gate, the embeddings and lm_head unquantized)."""
        return name.startswith("L") and t.ndim >= 2 and not name.endswith(".router")

    def _round_dtype(self, name: str) -> torch.dtype:
        """The precision a weight is rounded to on load: the weight dtype, unless the
        architecture keeps that tensor exact (see ``BailingTransformer``)."""
        return self.weight_dtype

    def _layer(self, i: int) -> LayerWeights:
        return LayerWeights(**{f.name: self.w.get(f"L{i}.{f.name}") for f in dataclasses.fields(LayerWeights)})

    # ------------------------------------------------------------------ forward
    def forward(self, batch: ForwardBatch, cache: KVCache | None, taps: list[Callable],
                logits_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (logits [len(logits_rows) or N, V] in the lm_head dtype,
        routed expert ids of the emitted rows [M, n_moe_layers, k] or None for dense models)."""
        emit = self._emitter(batch, taps) if taps else None
        spec = self.spec
        h = F.embedding(batch.token_ids, self.w["embed"])  # [N, H]
        if self.embed_scale is not None:
            h = h * self.embed_scale
        if emit:
            emit("embed", h)
        routing: list[torch.Tensor] = []
        residual, delta = None, h
        for i, lw in enumerate(self.layers):
            p = f"L{i}."
            if residual is None:
                x, residual = self.norm(delta, lw.attn_norm, self.eps), delta
            else:
                x, residual = self.norm(delta, lw.attn_norm, self.eps, residual=residual)
                if emit:
                    emit(f"L{i - 1}.resid_post", residual)
            if emit:
                emit(p + "attn_norm", x)

            a = self._attention(x, lw, batch, cache, i, emit, p)  # [N, H]
            if emit:
                emit(p + "attn_out", a)
            if lw.post_attn_norm is not None:
                a = self.norm(a, lw.post_attn_norm, self.eps)
            x, residual = self.norm(a, lw.mlp_norm, self.eps, residual=residual)
            if emit:
                emit(p + "resid_mid", residual)
                emit(p + "mlp_norm", x)

            delta, ids = self._mlp(x, lw, emit, p, batch.static_len is not None)
            if ids is not None:
                routing.append(ids if batch.emit_rows is None else ids[batch.emit_rows])
            if emit:
                emit(p + "mlp_out", delta)
            if lw.post_mlp_norm is not None:
                delta = self.norm(delta, lw.post_mlp_norm, self.eps)

        y, residual = self.norm(delta, self.w["final_norm"], self.eps, residual=residual)
        if emit:
            emit(f"L{spec.n_layers - 1}.resid_post", residual)
            emit("final_norm", y)
        logits = self.lm_head(y if logits_rows is None else y[logits_rows])
        if emit:
            emit("logits", logits if logits_rows is None else self.lm_head(y))
        return logits, (torch.stack(routing, dim=1) if routing else None)

    def _mlp(self, x: torch.Tensor, lw: LayerWeights, emit: Callable | None, p: str, static: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [N, H] -> (delta [N, H], routed expert ids [N, k] or None for a dense layer);
        ``static``: no shape may depend on the routing (CUDA-graph decode)."""
        if lw.router is not None:
            out, ids = moe_forward(x, lw.router, lw.experts_gate_up, lw.experts_down, self.moe_cfg, emit, p, static)
            if lw.shared_gate is not None:  # Qwen2-MoE: sigmoid(gate(x)) * shared(x), added in the act dtype
                shared = self._dense_mlp(x, lw.shared_gate_up, None, lw.shared_down, None)
                out = out + torch.sigmoid(F.linear(x, lw.shared_gate)) * shared
            return out, ids
        if lw.up is not None:
            return self._dense_mlp(x, lw.up, lw.up_bias, lw.down, lw.down_bias, gated=False), None
        return self._dense_mlp(x, lw.gate_up, lw.gate_up_bias, lw.down, lw.down_bias), None

    def _dense_mlp(self, x: torch.Tensor, gate_up: torch.Tensor, gate_up_bias: torch.Tensor | None,
                   down: torch.Tensor, down_bias: torch.Tensor | None, gated: bool = True) -> torch.Tensor:
        """The dense MLP on the fused gate_up (or, not ``gated``, the up projection alone):
        x [N, H] -> [N, H], the activation the checkpoint names in the ``activation`` knob's flavour."""
        h = self.linear(self._quantize_input(x), gate_up, gate_up_bias)  # [N, 2I] or [N, I]
        act = act_mul(h, self.knobs.activation, self.spec.mlp_act, gated)  # [N, I]
        return row_parallel_linear(act, down, down_bias, self.knobs.tp, self.act_quant, self.linear)

    def new_cache(self, rows: int, capacity: int, dtype: torch.dtype) -> KVCache:
        """The decode cache for ``rows`` sequences of up to ``capacity`` tokens, in ``dtype``."""
        return KVCache(self.spec.n_layers, rows, capacity, self.spec.n_kv_heads, self.spec.head_dim, dtype,
                       self.device)

    def _attention(self, x: torch.Tensor, lw: LayerWeights, batch: ForwardBatch, cache: KVCache | None,
                   i: int, emit: Callable | None, p: str) -> torch.Tensor:
        spec, n, h = self.spec, x.shape[0], self.spec.n_heads
        qkv = self.linear(self._quantize_input(x), lw.qkv, lw.qkv_bias)  # [N, q + 2 kv]
        qk = qkv[:, : spec.q_size + spec.kv_size].view(n, h + spec.n_kv_heads, spec.head_dim)
        v = qkv[:, spec.q_size + spec.kv_size:].view(n, spec.n_kv_heads, spec.head_dim)
        if lw.q_norm is not None and spec.qk_norm_per_head:  # per-head QK-norm (Qwen3, Gemma 3), before RoPE
            qk = torch.cat((self.norm(qk[:, :h], lw.q_norm, self.eps),
                            self.norm(qk[:, h:], lw.k_norm, self.eps)), dim=1)
        elif lw.q_norm is not None:  # OLMoE: over the whole q and k projections
            q_flat, k_flat = qk[:, :h].reshape(n, -1), qk[:, h:].reshape(n, -1)
            qk = torch.cat((self.norm(q_flat, lw.q_norm, self.eps),
                            self.norm(k_flat, lw.k_norm, self.eps)), dim=1).view(n, h + spec.n_kv_heads, -1)
        if spec.clip_qkv is not None:
            qk, v = qk.clamp(-spec.clip_qkv, spec.clip_qkv), v.clamp(-spec.clip_qkv, spec.clip_qkv)
        theta = spec.theta(i)
        if theta is not None:  # None: a NoPE layer (SmolLM3)
            qk = self.apply_rope(qk, batch, theta)  # q and k heads in one call, as vLLM
        q, k = qk[:, :h], qk[:, h:]  # [N, h, d], [N, kv, d]
        if emit:
            emit(p + "q", q.reshape(n, -1))
            emit(p + "k", k.reshape(n, -1))
            emit(p + "v", v.reshape(n, -1))
        window = spec.window(i) if self.knobs.sliding_window else None
        o = attention(q, k, v, batch, cache, i, self.knobs.attention, self.scale, window=window,
                      softcap=spec.attn_softcap)  # [N, h*d]
        return row_parallel_linear(o, lw.o, lw.o_bias, self.knobs.tp, self.act_quant, self.linear)

    def apply_rope(self, x: torch.Tensor, batch: ForwardBatch, theta: float | None = None) -> torch.Tensor:
        """RoPE of x [N, heads, d] at ``batch.positions`` with the ``rope`` knob's kernel and base
        ``theta`` (default: the model's ``rope_theta``). A static batch with ``rope="cached_table"``
        indexes the model's table directly: the kernel sizes its table from ``positions.max()``,
        a host read a CUDA graph cannot hold (same table, same ``rotate``, so the same numbers;
        tests/minirl/engine/test_engine_graphs.py holds them equal)."""
        theta = self.spec.rope_theta if theta is None else theta
        if batch.static_len is None or not self.rope_tables:
            return self.rope(x, batch.positions, theta=theta, **self.rope_kw)
        table = self.rope_tables[theta]
        cos, sin = table.index_select(0, batch.positions).chunk(2, dim=-1)  # [N, R/2] each
        compute = torch.promote_types(x.dtype, table.dtype)
        return rotate(x, cos, sin, self.spec.rotary_dim, self.rope_kw["style"], compute)

    def lm_head(self, y: torch.Tensor) -> torch.Tensor:
        """[N, H] -> logits [N, V] in the lm_head dtype (Ring-linear 5.2.1 LM Head), soft-capped
        where the family caps them (Gemma 2/3: what is softmaxed is ``tanh(l / cap) * cap``)."""
        logits = self.linear(y.to(self.lm_head_dtype), self.w["lm_head"])
        cap = self.spec.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @staticmethod
    def _emitter(batch: ForwardBatch, taps: list[Callable]) -> Callable[[str, torch.Tensor], None]:
        meta, rows = batch.tap_meta(), batch.emit_rows

        def emit(site: str, value: torch.Tensor) -> None:
            v = value if rows is None else value[rows]
            for tap in list(taps):
                tap(site, v, meta)

        return emit


def _offset_norm(kernel: Callable) -> Callable:
    """Gemma's RMSNorm through the ``rmsnorm`` knob's kernel: ``weight`` holds ``1 + w`` in fp32
    and the kernel runs on the fp32 input, rounded once to the input dtype at the end, which is
    transformers' ``Gemma*RMSNorm`` and vLLM's ``GemmaRMSNorm`` alike (both compute in fp32;
    ``bf16_compute`` still rounds every step). The residual add stays the decoder's own, in
    the stream's dtype."""

    def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
        h = x if residual is None else residual + x
        y = kernel(h.float(), weight, eps).to(x.dtype)
        return y if residual is None else (y, h)

    return norm
