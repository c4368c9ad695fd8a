"""Softmax-routed MoE decoders (Qwen3-MoE, Mixtral): Llama-family layers whose MLP is a router ->
top-k -> experts block on the sparse layers.

The two differ in numerics the spec records: Mixtral keeps the top-k weights in fp32, Qwen3-MoE
casts them to the router logits dtype; Mixtral's ``intermediate_size`` is the expert size and
every layer is sparse, Qwen3-MoE picks sparse layers by ``decoder_sparse_step``/``mlp_only_layers``.
"""

from __future__ import annotations

from minirl.engine.archs import Arch
from minirl.engine.archs import dense
from minirl.engine.config import ModelSpec, dense_fields
from minirl.engine.model import Transformer
from minirl.engine.weight_map import Layout, Recipe, one, stack, stack_gate_up


def spec(cfg: dict) -> ModelSpec:
    common = dense_fields(cfg)
    if cfg["model_type"] == "mixtral":
        return ModelSpec(**common, moe_layers=tuple(range(common["n_layers"])),
                         n_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                         moe_intermediate_size=cfg["intermediate_size"], renormalize=True,
                         topk_weights_in_logits_dtype=False)
    n_experts = cfg.get("num_experts") or cfg["num_local_experts"]
    step, dense_only = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
    moe = tuple(i for i in range(common["n_layers"])
                if i not in dense_only and n_experts > 0 and (i + 1) % step == 0)
    return ModelSpec(**common, moe_layers=moe, n_experts=n_experts, top_k=cfg["num_experts_per_tok"],
                     moe_intermediate_size=cfg["moe_intermediate_size"],
                     renormalize=bool(cfg.get("norm_topk_prob", False)), topk_weights_in_logits_dtype=True)


def recipes(spec: ModelSpec) -> list[Recipe]:
    return dense.recipes(spec, moe_layer=expert_recipes)


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
