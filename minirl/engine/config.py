"""What the engine needs to know about a checkpoint, read from its HF ``config.json``.

Why a separate spec instead of reading the dict everywhere: each architecture spells the same
thing differently (``num_experts`` vs ``num_local_experts``, ``rope_theta`` vs
``rope_parameters``), and a few numerics differ per architecture (Mixtral keeps the top-k
weights in fp32, Qwen3-MoE casts them to the router logits dtype). Normalising once here keeps
the compute code free of ``if arch == ...``.
Which architecture fills the spec is the registry's business (``minirl.engine.archs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

class ConfigFieldError(ValueError):
    """A config.json value the engine cannot compute with, named by its key before any weight is
    read: a kernel's own complaint ("eps must be > 0") or a shape of ``'abc'`` does not say which
    line of which file to fix."""

    def __init__(self, key: str, value: object, want: str) -> None:
        super().__init__(f"config.json: {key}={value!r}: {key} must be {want}; fix {key} in the checkpoint's "
                         f"config.json")


def positive_number(cfg: dict, key: str, default: float | None = None) -> float | None:
    """``cfg[key]`` as a positive finite float (``default`` when absent or null): an eps, a RoPE base,
    a score scale or a soft-cap of 0, below 0, NaN, inf or a string is refused by name."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigFieldError(key, value, "a positive finite number")
    return float(value)


def positive_int(cfg: dict, key: str, optional: bool = False) -> int | None:
    """``cfg[key]`` as an int >= 1 (a size: hidden_size, a head count, a window); ``optional``: None
    when absent or null, else a missing key is a ``KeyError`` as before."""
    value = cfg.get(key) if optional else cfg[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigFieldError(key, value, "an int >= 1")
    return value


def json_bool(cfg: dict, key: str, default: bool) -> bool:
    """``cfg[key]`` as a JSON true/false: the string ``"false"`` is truthy in Python and would tie
    the embeddings of a checkpoint that says not to."""
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ConfigFieldError(key, value, "true or false (a JSON boolean, not a string)")
    return value


@dataclass(frozen=True)
class HybridSpec:
    """BailingHybrid (Ring-linear) only: linear-attention / MLA layout and sigmoid-routing details."""

    layer_types: tuple[str, ...]  # "linear_attention" | "full_attention" per layer
    linear_heads: int
    linear_head_dim: int
    conv_kernel: int
    safe_gate: bool
    gate_lower_bound: float
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    shared_intermediate_size: int

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rotary_dim: int
    max_positions: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    moe_layers: tuple[int, ...] = ()
    n_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    renormalize: bool = True
    topk_weights_in_logits_dtype: bool = True
    """Qwen3-MoE casts the routing weights to the router logits dtype before the expert
    multiply; Mixtral keeps them in fp32 (so ``out_bf16 * w_fp32`` is rounded once)."""
    hybrid: HybridSpec | None = None
    """BailingHybrid only: linear-attention / MLA layout and sigmoid-routing details."""
    mlp_act: str = "silu"
    """The MLP's activation, by its transformers ``ACT2FN`` name (``MLP_ACTS``)."""
    gated_mlp: bool = True
    """``act(gate) * up`` (SwiGLU / GeGLU); False: ``act(up)`` with no gate (Arcee's ReLU²)."""
    qk_norm_per_head: bool = True
    """QK-norm over each head's ``head_dim`` (Qwen3, Gemma 3); False: over the whole q / k
    projection before the head split (OLMoE)."""
    clip_qkv: float | None = None
    """OLMoE: q, k and v clamped to ``[-clip_qkv, clip_qkv]`` after the projection (and QK-norm)."""
    layer_rope_theta: tuple[float | None, ...] = ()
    """Per-layer RoPE base; None marks a NoPE layer (SmolLM3), ``()`` means ``rope_theta`` everywhere.
    Gemma 3 gives its sliding layers ``rope_local_base_freq``."""
    layer_window: tuple[int | None, ...] = ()
    """Per-layer sliding window (a query sees keys less than ``window`` positions back, transformers'
    ``sliding_window_overlay``); None or ``()``: full causal attention."""
    attn_scale: float | None = None
    """Attention score scale; None: ``head_dim ** -0.5`` (Gemma 2/3: ``query_pre_attn_scalar ** -0.5``)."""
    attn_softcap: float | None = None
    """Gemma 2: scores ``tanh(s / cap) * cap`` before the mask and softmax."""
    final_softcap: float | None = None
    """Gemma 2/3: logits ``tanh(l / cap) * cap``, what is softmaxed."""
    embed_scale: float | None = None
    """Gemma: the embedding times ``sqrt(hidden_size)``, the factor rounded to the model dtype first."""
    norm_offset: bool = False
    """Gemma: every RMSNorm multiplies by ``1 + weight`` (computed in fp32, one rounding at the end)."""
    sandwich_norms: bool = False
    """Gemma 2/3: the attention and MLP outputs are normed before their residual add
    (``post_attention_layernorm`` / ``post_feedforward_layernorm``); the MLP's input norm is
    ``pre_feedforward_layernorm``."""
    shared_expert_size: int = 0
    """Qwen2-MoE: a dense shared expert of this size added to the routed ones, scaled by
    ``sigmoid(shared_expert_gate(x))``; 0: none."""

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers

    def theta(self, layer: int) -> float | None:
        """The RoPE base of ``layer`` (None: a NoPE layer)."""
        return self.layer_rope_theta[layer] if self.layer_rope_theta else self.rope_theta

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (None: full causal attention)."""
        return self.layer_window[layer] if self.layer_window else None


MLP_ACTS = ("silu", "gelu_pytorch_tanh", "gelu", "relu2")
"""transformers ``ACT2FN`` names the engine's MLP computes (``minirl.engine.ops.ACT_FNS``)."""


def check_common(cfg: dict) -> None:
    """Features no architecture of the engine implements: fail at load, naming the feature."""
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=true is not supported (the engine decodes causally)")
    for params in rope_layers(cfg).values():
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default' RoPE)")


def mlp_act(cfg: dict, key: str = "hidden_act") -> str:
    """The MLP activation named by ``cfg[key]`` (absent: the family's transformers default, GeGLU
    for Gemma, else silu), refused by name when the engine lacks it."""
    act = cfg.get(key) or ("gelu_pytorch_tanh" if cfg.get("model_type", "").startswith("gemma") else "silu")
    if act not in MLP_ACTS:
        raise ValueError(f"{key} {act!r} is not supported; the engine's MLP computes {', '.join(MLP_ACTS)}")
    return act


def rope_layers(cfg: dict) -> dict[str, dict]:
    """RoPE parameters per layer type: Gemma 3's ``rope_parameters`` is keyed by layer type
    (``full_attention`` / ``sliding_attention``); every other family has one dict, for all layers."""
    params = rope_params(cfg)
    if params and all(isinstance(v, dict) for v in params.values()):
        return params
    return {"full_attention": params}


def layer_windows(cfg: dict, every_layer: bool = False) -> tuple[int | None, ...]:
    """Per-layer sliding windows as transformers applies them: on the ``sliding_attention``
    layers of ``layer_types`` (Gemma 2/3 always; Qwen2/3 and SmolLM3 only with
    ``use_sliding_window``), or on every layer (``every_layer``: Mistral's ``sliding_window``).
    A window that covers ``max_position_embeddings`` changes nothing and is dropped."""
    n = cfg["num_hidden_layers"]
    if cfg.get("sliding_window") is None or not cfg.get("use_sliding_window", True):
        return ()
    window = positive_int(cfg, "sliding_window")  # 0 would mask every key; transformers fails on it
    if window >= cfg["max_position_embeddings"]:
        return ()
    if every_layer:
        return (int(window),) * n
    types = cfg.get("layer_types")
    if types is None:
        raise ValueError(f"config.json of {cfg['model_type']!r} sets sliding_window={window} but no layer_types, "
                         f"so which layers slide is transformers' per-family rule; load and re-save the "
                         f"config with transformers >= 5, which writes layer_types")
    out = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return out if any(out) else ()


def rope_params(cfg: dict) -> dict:
    """``rope_parameters`` (transformers 5) or the older ``rope_scaling`` dict, else {}."""
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def rope_theta(cfg: dict) -> float:
    params = rope_params(cfg)
    return positive_number(params, "rope_theta") or positive_number(cfg, "rope_theta", 10000.0)


def dense_fields(cfg: dict, *, qkv_bias: bool, o_bias: bool, qk_norm: bool = False) -> dict:
    """The ModelSpec fields every Llama-shaped decoder shares (attention, dense MLP, RoPE); the
    family says which biases and norms its attention has (its config fields differ)."""
    hidden, n_heads = positive_int(cfg, "hidden_size"), positive_int(cfg, "num_attention_heads")
    head_dim = positive_int(cfg, "head_dim", optional=True) or hidden // n_heads
    partial = rope_params(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return dict(
        arch=cfg["model_type"],
        vocab_size=positive_int(cfg, "vocab_size"),
        hidden_size=hidden,
        n_layers=positive_int(cfg, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=head_dim,
        intermediate_size=positive_int(cfg, "intermediate_size"),
        rms_norm_eps=positive_number(cfg, "rms_norm_eps", 1e-6),
        rope_theta=rope_theta(cfg),
        rotary_dim=int(head_dim * partial),
        max_positions=cfg["max_position_embeddings"],
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=qk_norm,
        tie_word_embeddings=json_bool(cfg, "tie_word_embeddings", False),
        eos_token_ids=eos_token_ids(cfg),
        mlp_act=mlp_act(cfg),
    )


def eos_token_ids(cfg: dict) -> tuple[int, ...]:
    """``eos_token_id`` of a config.json as a tuple (HF allows an int, a list or null)."""
    eos = cfg.get("eos_token_id")
    return () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
