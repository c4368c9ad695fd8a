"""Softmax-routed top-k MoE decoders: Llama-shaped layers whose MLP is a router -> softmax ->
top-k -> experts block on the sparse layers.

What differs, the spec records: Mixtral keeps the top-k weights in fp32, Qwen3-MoE, Qwen2-MoE
and OLMoE cast them to the router logits dtype; Mixtral's and OLMoE's ``intermediate_size`` is
the expert size and every layer is sparse, the Qwen MoEs pick sparse layers by
``decoder_sparse_step``/``mlp_only_layers``; Qwen2-MoE adds q/k/v biases and a shared expert
scaled by ``sigmoid(shared_expert_gate(x))``; Qwen3-MoE has per-head QK-norm, OLMoE a QK-norm over
the whole q / k projection and an optional ``clip_qkv``.
"""

from __future__ import annotations

from minirl.engine.archs import Arch
from minirl.engine.archs import dense
from minirl.engine.config import ModelSpec, dense_fields, layer_windows
from minirl.engine.model import Transformer
from minirl.engine.weight_map import Layout, Recipe, one, single, stack, stack_gate_up


def spec(cfg: dict) -> ModelSpec:
    family = cfg["model_type"]
    bias = bool(cfg.get("attention_bias", False))
    common = dense_fields(cfg, qkv_bias=bool(cfg.get("qkv_bias", True)) if family == "qwen2_moe" else bias,
                          o_bias=bias and family != "qwen2_moe", qk_norm=family in ("qwen3_moe", "olmoe"))
    common["layer_window"] = layer_windows(cfg, every_layer=family != "qwen2_moe")  # Qwen2-MoE: by layer_types
    if family in ("mixtral", "olmoe"):
        n_experts = cfg["num_local_experts"] if family == "mixtral" else cfg["num_experts"]
        return ModelSpec(**common, moe_layers=tuple(range(common["n_layers"])), n_experts=n_experts,
                         top_k=cfg["num_experts_per_tok"], moe_intermediate_size=cfg["intermediate_size"],
                         renormalize=family == "mixtral" or bool(cfg.get("norm_topk_prob", False)),
                         topk_weights_in_logits_dtype=family == "olmoe", qk_norm_per_head=family != "olmoe",
                         clip_qkv=cfg.get("clip_qkv"))
    n_experts = cfg.get("num_experts") or cfg["num_local_experts"]
    step, dense_only = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
    moe = tuple(i for i in range(common["n_layers"])
                if i not in dense_only and n_experts > 0 and (i + 1) % step == 0)
    return ModelSpec(**common, moe_layers=moe, n_experts=n_experts, top_k=cfg["num_experts_per_tok"],
                     moe_intermediate_size=cfg["moe_intermediate_size"],
                     renormalize=bool(cfg.get("norm_topk_prob", False)), topk_weights_in_logits_dtype=True,
                     shared_expert_size=cfg["shared_expert_intermediate_size"] if family == "qwen2_moe" else 0)


def recipes(spec: ModelSpec) -> list[Recipe]:
    return dense.recipes(spec, moe_layer=moe_recipes)


def moe_recipes(spec: ModelSpec, i: int) -> list[Recipe]:
    """Router and experts of MoE layer ``i``, plus Qwen2-MoE's shared expert and its gate."""
    out = expert_recipes(spec, i)
    if spec.shared_expert_size:
        out += dense.mlp_recipes(spec, i, prefix="mlp.shared_expert.", target="shared_", size=spec.shared_expert_size)
        out.append(single(f"L{i}.shared_gate", f"model.layers.{i}.mlp.shared_expert_gate.weight",
                          (1, spec.hidden_size)))
    return out


def expert_recipes(spec: ModelSpec, i: int) -> list[Recipe]:
    """Router + stacked experts of MoE layer ``i``: per-expert tensors on disk (Mixtral spells them
    ``block_sparse_moe.experts.j.w1``), or transformers 5's fused in-memory layout."""
    h, n, e = spec.hidden_size, spec.moe_intermediate_size, spec.n_experts
    p, t = f"model.layers.{i}.", f"L{i}."
    fused = p + "mlp."  # transformers 5 in-memory layout, both architectures
    if spec.arch == "mixtral":
        disk, gate, up, down = p + "block_sparse_moe.", "w1", "w3", "w2"
    else:
        disk, gate, up, down = p + "mlp.", "gate_proj", "up_proj", "down_proj"
    per_expert = [[(f"{disk}experts.{j}.{w}.weight", shape) for j in range(e)]
                  for w, shape in ((gate, (n, h)), (up, (n, h)), (down, (h, n)))]
    return [
        Recipe(t + "router", (Layout(((disk + "gate.weight", (e, h)),), one),
                              Layout(((fused + "gate.weight", (e, h)),), one))),
        Recipe(t + "experts_gate_up", (Layout(tuple(per_expert[0] + per_expert[1]), stack_gate_up),
                                       Layout(((fused + "experts.gate_up_proj", (e, 2 * n, h)),), one))),
        Recipe(t + "experts_down", (Layout(tuple(per_expert[2]), stack),
                                    Layout(((fused + "experts.down_proj", (e, h, n)),), one))),
    ]


ARCH = Arch(spec=spec, recipes=recipes, model=Transformer)
