"""What the engine needs to know about a checkpoint, read from its HF ``config.json``.

Why a separate spec instead of reading the dict everywhere: each architecture spells the same
thing differently (``num_experts`` vs ``num_local_experts``, ``rope_theta`` vs
``rope_parameters``), and a few numerics differ per architecture (Mixtral keeps the top-k
weights in fp32, Qwen3-MoE casts them to the router logits dtype). Normalising once here keeps
the compute code free of ``if arch == ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minirl.engine.bailing import HybridSpec

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "bailing_hybrid")


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


def spec_from_config(cfg: dict) -> ModelSpec:
    """Normalise an HF config dict; unsupported features raise naming what is supported."""
    arch = cfg.get("model_type")
    if arch not in SUPPORTED_ARCHS:
        archs = cfg.get("architectures") or []
        raise ValueError(
            f"unsupported architecture {arch!r} {archs}; the minirl engine supports model_type "
            f"{', '.join(SUPPORTED_ARCHS)}. Use the 'hf' engine for other architectures."
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if cfg.get("use_sliding_window") or "sliding_attention" in (cfg.get("layer_types") or []):
        raise ValueError("sliding-window attention is not supported; set use_sliding_window=false")

    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default' RoPE)")
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if arch == "bailing_hybrid":  # MLA + linear attention: its own fields (bailing.py)
        from minirl.engine.bailing import bailing_spec
        return bailing_spec(cfg, float(theta))

    hidden, n_heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // n_heads
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    eos_ids = eos_token_ids(cfg)
    bias = bool(cfg.get("attention_bias", False))
    common = dict(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=head_dim,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rotary_dim=int(head_dim * partial),
        max_positions=cfg["max_position_embeddings"],
        qkv_bias=arch == "qwen2" or bias,
        o_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=arch in ("qwen3", "qwen3_moe"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        eos_token_ids=eos_ids,
    )
    if arch == "qwen3_moe":
        n_experts = cfg.get("num_experts") or cfg["num_local_experts"]
        step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
        moe = tuple(i for i in range(common["n_layers"])
                    if i not in dense and n_experts > 0 and (i + 1) % step == 0)
        return ModelSpec(**common, moe_layers=moe, n_experts=n_experts, top_k=cfg["num_experts_per_tok"],
                         moe_intermediate_size=cfg["moe_intermediate_size"],
                         renormalize=bool(cfg.get("norm_topk_prob", False)),
                         topk_weights_in_logits_dtype=True)
    if arch == "mixtral":
        # Mixtral's intermediate_size *is* the expert size; every layer is sparse.
        return ModelSpec(**common, moe_layers=tuple(range(common["n_layers"])),
                         n_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                         moe_intermediate_size=cfg["intermediate_size"], renormalize=True,
                         topk_weights_in_logits_dtype=False)
    return ModelSpec(**common)


def eos_token_ids(cfg: dict) -> tuple[int, ...]:
    """``eos_token_id`` of a config.json as a tuple (HF allows an int, a list or null)."""
    eos = cfg.get("eos_token_id")
    return () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
