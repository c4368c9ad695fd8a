"""What the engine needs to know about a checkpoint, read from its HF ``config.json``.

Why a separate spec instead of reading the dict everywhere: each architecture spells the same
thing differently (``num_experts`` vs ``num_local_experts``, ``rope_theta`` vs
``rope_parameters``), and a few numerics differ per architecture (Mixtral keeps the top-k
weights in fp32, Qwen3-MoE casts them to the router logits dtype). Normalising once here keeps
the compute code free of ``if arch == ...``.
Which architecture fills the spec is the registry's business (``minirl.engine.archs``).
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers


def check_common(cfg: dict) -> None:
    """Features no architecture of the engine implements: fail at load, naming the feature."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if cfg.get("use_sliding_window") or "sliding_attention" in (cfg.get("layer_types") or []):
        raise ValueError("sliding-window attention is not supported; set use_sliding_window=false")
    rope_type = rope_params(cfg).get("rope_type", rope_params(cfg).get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default' RoPE)")


def rope_params(cfg: dict) -> dict:
    """``rope_parameters`` (transformers 5) or the older ``rope_scaling`` dict, else {}."""
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def rope_theta(cfg: dict) -> float:
    return float(rope_params(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0)))


def dense_fields(cfg: dict) -> dict:
    """The ModelSpec fields every Llama-family decoder shares (attention, dense MLP, RoPE)."""
    arch = cfg["model_type"]
    hidden, n_heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // n_heads
    partial = rope_params(cfg).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    bias = bool(cfg.get("attention_bias", False))
    return dict(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=head_dim,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta(cfg),
        rotary_dim=int(head_dim * partial),
        max_positions=cfg["max_position_embeddings"],
        qkv_bias=arch == "qwen2" or bias,
        o_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=arch in ("qwen3", "qwen3_moe"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        eos_token_ids=eos_token_ids(cfg),
    )


def eos_token_ids(cfg: dict) -> tuple[int, ...]:
    """``eos_token_id`` of a config.json as a tuple (HF allows an int, a list or null)."""
    eos = cfg.get("eos_token_id")
    return () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
