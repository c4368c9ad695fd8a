"""Llama-shaped dense decoders: attention + gated MLP, RMSNorm, RoPE.

Accepted by what they compute, each a Llama with some of these: q/k/v biases (Qwen2, Seed-OSS,
``attention_bias``), an o_proj bias (``attention_bias``; Seed-OSS ``attention_out_bias``),
per-head QK-norm (Qwen3), sliding windows (Mistral on every layer; Qwen2/3, SmolLM3 on their
``sliding_attention`` layers), NoPE layers (SmolLM3 ``no_rope_layers``), a non-gated ReLU² MLP
(Arcee). The recipes map HF names onto the engine's fused layout (``qkv``, ``gate_up``). MoE
families reuse ``recipes`` with their own per-layer expert recipes (``softmax_moe``).
"""

from __future__ import annotations

from collections.abc import Callable

from minirl.engine.archs import Arch
from minirl.engine.config import ModelSpec, dense_fields, layer_windows
from minirl.engine.model import Transformer
from minirl.engine.weight_map import Layout, Recipe, cat, one, single


WINDOWED = ("mistral", "qwen2", "qwen3", "smollm3")
"""The dense families whose transformers attention applies ``sliding_window`` (Llama, Arcee and
Seed-OSS ignore the field)."""


def spec(cfg: dict) -> ModelSpec:
    family = cfg["model_type"]
    bias = bool(cfg.get("attention_bias", family == "seed_oss"))  # Seed-OSS defaults to q/k/v biases
    fields = dense_fields(cfg, qkv_bias=family == "qwen2" or bias,
                          o_bias=bool(cfg.get("attention_out_bias", False)) if family == "seed_oss" else bias,
                          qk_norm=family == "qwen3")
    return ModelSpec(**fields, gated_mlp=family != "arcee",
                     layer_window=layer_windows(cfg, every_layer=family == "mistral") if family in WINDOWED else (),
                     layer_rope_theta=nope_layers(cfg, fields["rope_theta"]) if family == "smollm3" else ())


def nope_layers(cfg: dict, theta: float) -> tuple[float | None, ...]:
    """SmolLM3's ``no_rope_layers`` (1 = RoPE, 0 = NoPE per layer; default: every
    ``no_rope_layer_interval``-th layer is NoPE) as per-layer RoPE bases."""
    n, interval = cfg["num_hidden_layers"], cfg.get("no_rope_layer_interval", 4)
    uses = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    return tuple(theta if use else None for use in uses)


def recipes(spec: ModelSpec, moe_layer: Callable[[ModelSpec, int], list[Recipe]] | None = None) -> list[Recipe]:
    """Every engine tensor of a Llama-family checkpoint; ``moe_layer(spec, i)`` gives the MLP
    recipes of the sparse layers (MoE families only)."""
    h, q, kv, hd = spec.hidden_size, spec.q_size, spec.kv_size, spec.head_dim
    out = [Recipe("embed", (Layout((("model.embed_tokens.weight", (spec.vocab_size, h)),), one),)),
           Recipe("final_norm", (Layout((("model.norm.weight", (h,)),), one),))]
    if not spec.tie_word_embeddings:
        out.append(Recipe("lm_head", (Layout((("lm_head.weight", (spec.vocab_size, h)),), one),)))

    for i in range(spec.n_layers):
        p, t = f"model.layers.{i}.", f"L{i}."
        a = p + "self_attn."
        if spec.sandwich_norms:  # Gemma 2/3: the MLP's input norm is pre_feedforward_layernorm
            out += [single(t + "mlp_norm", p + "pre_feedforward_layernorm.weight", (h,)),
                    single(t + "post_attn_norm", p + "post_attention_layernorm.weight", (h,)),
                    single(t + "post_mlp_norm", p + "post_feedforward_layernorm.weight", (h,))]
        else:
            out.append(single(t + "mlp_norm", p + "post_attention_layernorm.weight", (h,)))
        out += [single(t + "attn_norm", p + "input_layernorm.weight", (h,)),
                Recipe(t + "qkv", (Layout(((a + "q_proj.weight", (q, h)), (a + "k_proj.weight", (kv, h)),
                                           (a + "v_proj.weight", (kv, h))), cat),)),
                single(t + "o", a + "o_proj.weight", (h, q))]
        if spec.qkv_bias:
            out.append(Recipe(t + "qkv_bias", (Layout(((a + "q_proj.bias", (q,)), (a + "k_proj.bias", (kv,)),
                                                       (a + "v_proj.bias", (kv,))), cat),)))
        if spec.o_bias:
            out.append(single(t + "o_bias", a + "o_proj.bias", (h,)))
        if spec.qk_norm:  # per head, or (OLMoE) over the whole q / k projection
            out += [single(t + "q_norm", a + "q_norm.weight", (hd if spec.qk_norm_per_head else q,)),
                    single(t + "k_norm", a + "k_norm.weight", (hd if spec.qk_norm_per_head else kv,))]
        if spec.is_moe(i):
            out += moe_layer(spec, i)
        else:
            out += mlp_recipes(spec, i)
    return out


def mlp_recipes(spec: ModelSpec, i: int, prefix: str = "mlp.", target: str = "",
                size: int | None = None) -> list[Recipe]:
    """A dense MLP's tensors: fused ``gate_up`` (or ``up`` alone, not ``gated_mlp``) and ``down``,
    with biases when ``mlp_bias``; ``prefix``/``target``/``size`` place a shared expert."""
    h, n = spec.hidden_size, size or spec.intermediate_size
    m, t = f"model.layers.{i}.{prefix}", f"L{i}.{target}"
    parts = ("gate", "up") if spec.gated_mlp else ("up",)
    fused = "gate_up" if spec.gated_mlp else "up"
    out = [Recipe(t + fused, (Layout(tuple((f"{m}{x}_proj.weight", (n, h)) for x in parts), cat),)),
           single(t + "down", m + "down_proj.weight", (h, n))]
    if spec.mlp_bias:
        out += [Recipe(t + fused + "_bias", (Layout(tuple((f"{m}{x}_proj.bias", (n,)) for x in parts), cat),)),
                single(t + "down_bias", m + "down_proj.bias", (h,))]
    return out


ARCH = Arch(spec=spec, recipes=recipes, model=Transformer)
