"""The Gemma family (Gemma, Gemma 2, Gemma 3 text): Llama-shaped layers with Gemma's numerics.

What Gemma computes that Llama does not, each a ``ModelSpec`` field the engine's ``Transformer``
reads (so every knob applies to it as to the rest): the embedding times ``sqrt(hidden_size)``
(the factor rounded to the model dtype, as transformers' buffer is), ``1 + weight`` RMSNorms in
fp32, GeGLU (``gelu`` tanh approximation); Gemma 2/3 add sandwich norms (attention and MLP
outputs normed before their residual add), ``query_pre_attn_scalar ** -0.5`` as the score scale,
sliding-window layers and the final logit soft-cap; Gemma 2 soft-caps the attention scores,
Gemma 3 has per-head QK-norm and its own RoPE base on the sliding layers. transformers' Gemma 3
attention ignores ``attn_logit_softcapping``, and so does this.
"""

from __future__ import annotations

from types import SimpleNamespace

from minirl import families
from minirl.engine.archs import Arch
from minirl.engine.archs import dense
from minirl.engine.config import (ModelSpec, dense_fields, json_bool, layer_windows, mlp_act, positive_number,
                                  rope_layers)


def spec(cfg: dict) -> ModelSpec:
    """The embedding scale, the block shape and the logit soft-cap are read off the family
    contract (``minirl.families``), the one place every engine's capture reads them too."""
    family = cfg["model_type"]
    view = SimpleNamespace(**cfg)  # the contract reads config attributes
    bias = bool(cfg.get("attention_bias", False))
    fields = dense_fields(cfg, qkv_bias=bias, o_bias=bias, qk_norm=family == "gemma3_text")
    fields["tie_word_embeddings"] = json_bool(cfg, "tie_word_embeddings", True)
    common = dict(embed_scale=families.embed_scale(view), norm_offset=True,
                  sandwich_norms=families.family(view).block == "sandwich",
                  final_softcap=families.logits_transform(view).softcap)
    if family == "gemma":
        return ModelSpec(**fields, **common)
    fields["mlp_act"] = mlp_act(cfg, "hidden_activation")
    common.update(attn_scale=positive_number(cfg, "query_pre_attn_scalar", 256.0) ** -0.5,
                  layer_window=layer_windows(cfg))
    if family == "gemma2":
        return ModelSpec(**fields, **common, attn_softcap=positive_number(cfg, "attn_logit_softcapping"))
    thetas = {kind: float(p["rope_theta"]) for kind, p in rope_layers(cfg).items() if "rope_theta" in p}
    full = thetas.get("full_attention", float(cfg.get("rope_theta", 1_000_000.0)))
    local = thetas.get("sliding_attention", float(cfg.get("rope_local_base_freq", 10_000.0)))
    types = cfg.get("layer_types") or ["full_attention"] * fields["n_layers"]
    fields["rope_theta"] = full
    return ModelSpec(**fields, **common,
                     layer_rope_theta=tuple(local if t == "sliding_attention" else full for t in types))


ARCH = Arch(spec=spec, recipes=dense.recipes, model=dense.Transformer)
