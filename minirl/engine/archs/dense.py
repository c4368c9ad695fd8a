"""Llama-family dense decoders (Llama, Qwen2, Qwen3): attention + SwiGLU MLP, RMSNorm, RoPE.

The recipes map HF names onto the engine's fused layout (``qkv``, ``gate_up``); Qwen2 adds q/k/v
biases and Qwen3 a per-head QK-norm, both read off the spec. MoE families reuse ``recipes`` with
their own per-layer expert recipes (``softmax_moe``).
"""

from __future__ import annotations

from collections.abc import Callable

from minirl.engine.archs import Arch
from minirl.engine.config import ModelSpec, dense_fields
from minirl.engine.model import Transformer
from minirl.engine.weight_map import Layout, Recipe, cat, one, single


def spec(cfg: dict) -> ModelSpec:
    return ModelSpec(**dense_fields(cfg))


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
        out += [single(t + "attn_norm", p + "input_layernorm.weight", (h,)),
                single(t + "mlp_norm", p + "post_attention_layernorm.weight", (h,)),
                Recipe(t + "qkv", (Layout(((a + "q_proj.weight", (q, h)), (a + "k_proj.weight", (kv, h)),
                                           (a + "v_proj.weight", (kv, h))), cat),)),
                single(t + "o", a + "o_proj.weight", (h, q))]
        if spec.qkv_bias:
            out.append(Recipe(t + "qkv_bias", (Layout(((a + "q_proj.bias", (q,)), (a + "k_proj.bias", (kv,)),
                                                       (a + "v_proj.bias", (kv,))), cat),)))
        if spec.o_bias:
            out.append(single(t + "o_bias", a + "o_proj.bias", (h,)))
        if spec.qk_norm:
            out += [single(t + "q_norm", a + "q_norm.weight", (hd,)),
                    single(t + "k_norm", a + "k_norm.weight", (hd,))]
        if spec.is_moe(i):
            out += moe_layer(spec, i)
        else:
            m, n = p + "mlp.", spec.intermediate_size
            out += [Recipe(t + "gate_up", (Layout(((m + "gate_proj.weight", (n, h)),
                                                   (m + "up_proj.weight", (n, h))), cat),)),
                    single(t + "down", m + "down_proj.weight", (h, n))]
            if spec.mlp_bias:
                out += [Recipe(t + "gate_up_bias", (Layout(((m + "gate_proj.bias", (n,)),
                                                            (m + "up_proj.bias", (n,))), cat),)),
                        single(t + "down_bias", m + "down_proj.bias", (h,))]
    return out


ARCH = Arch(spec=spec, recipes=recipes, model=Transformer)
