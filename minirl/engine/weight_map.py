"""HF parameter names -> the engine's fused layout (qkv, gate_up, stacked experts).

Two HF layouts reach the engine: the on-disk checkpoint (per-expert tensors,
``mlp.experts.3.gate_proj.weight``; Mixtral's ``block_sparse_moe.experts.3.w1.weight``) and the
in-memory state dict of a transformers 5 model (``mlp.experts.gate_up_proj`` [E, 2I, H]), which
is what ``Engine.load_weights`` receives from the trainer every RL step. Each engine tensor
lists the source layouts it can be built from; everything is validated (names *and* shapes)
before anything is built, so a bad state dict never half-updates the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from minirl.engine.config import ModelSpec

Shape = tuple[int, ...]
Combine = Callable[[list[torch.Tensor]], torch.Tensor]


def _one(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0]


def _cat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(ts, dim=0)


def _stack(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(ts, dim=0)


def _stack_gate_up(ts: list[torch.Tensor]) -> torch.Tensor:
    """[gate_0..gate_{E-1}, up_0..up_{E-1}] ([I, H] each) -> [E, 2I, H] (gate rows first)."""
    e = len(ts) // 2
    return torch.stack([torch.cat((g, u), dim=0) for g, u in zip(ts[:e], ts[e:])], dim=0)


@dataclass(frozen=True)
class Layout:
    """One way to build an engine tensor: these HF tensors, combined like this."""

    sources: tuple[tuple[str, Shape], ...]
    combine: Combine


@dataclass(frozen=True)
class Recipe:
    target: str
    layouts: tuple[Layout, ...]  # first one fully present wins


class WeightMismatchError(ValueError):
    """A state dict does not fit the engine; lists the first offending names."""


def _recipes(spec: ModelSpec) -> list[Recipe]:
    if spec.hybrid is not None:  # BailingHybrid: MLA + linear-attention tensors (bailing.py)
        from minirl.engine.bailing import bailing_recipes
        return bailing_recipes(spec)
    h, q, kv, hd = spec.hidden_size, spec.q_size, spec.kv_size, spec.head_dim
    out = [Recipe("embed", (Layout((("model.embed_tokens.weight", (spec.vocab_size, h)),), _one),)),
           Recipe("final_norm", (Layout((("model.norm.weight", (h,)),), _one),))]
    if not spec.tie_word_embeddings:
        out.append(Recipe("lm_head", (Layout((("lm_head.weight", (spec.vocab_size, h)),), _one),)))

    def single(target: str, name: str, shape: Shape) -> Recipe:
        return Recipe(target, (Layout(((name, shape),), _one),))

    for i in range(spec.n_layers):
        p, t = f"model.layers.{i}.", f"L{i}."
        a = p + "self_attn."
        out += [single(t + "attn_norm", p + "input_layernorm.weight", (h,)),
                single(t + "mlp_norm", p + "post_attention_layernorm.weight", (h,)),
                Recipe(t + "qkv", (Layout(((a + "q_proj.weight", (q, h)), (a + "k_proj.weight", (kv, h)),
                                           (a + "v_proj.weight", (kv, h))), _cat),)),
                single(t + "o", a + "o_proj.weight", (h, q))]
        if spec.qkv_bias:
            out.append(Recipe(t + "qkv_bias", (Layout(((a + "q_proj.bias", (q,)), (a + "k_proj.bias", (kv,)),
                                                       (a + "v_proj.bias", (kv,))), _cat),)))
        if spec.o_bias:
            out.append(single(t + "o_bias", a + "o_proj.bias", (h,)))
        if spec.qk_norm:
            out += [single(t + "q_norm", a + "q_norm.weight", (hd,)),
                    single(t + "k_norm", a + "k_norm.weight", (hd,))]
        if spec.is_moe(i):
            out += _moe_recipes(spec, i)
        else:
            m, n = p + "mlp.", spec.intermediate_size
            out += [Recipe(t + "gate_up", (Layout(((m + "gate_proj.weight", (n, h)),
                                                   (m + "up_proj.weight", (n, h))), _cat),)),
                    single(t + "down", m + "down_proj.weight", (h, n))]
            if spec.mlp_bias:
                out += [Recipe(t + "gate_up_bias", (Layout(((m + "gate_proj.bias", (n,)),
                                                            (m + "up_proj.bias", (n,))), _cat),)),
                        single(t + "down_bias", m + "down_proj.bias", (h,))]
    return out


def _moe_recipes(spec: ModelSpec, i: int) -> list[Recipe]:
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
        Recipe(t + "router", (Layout(((disk + "gate.weight", (e, h)),), _one),
                              Layout(((fused + "gate.weight", (e, h)),), _one))),
        Recipe(t + "experts_gate_up", (Layout(tuple(per_expert[0] + per_expert[1]), _stack_gate_up),
                                       Layout(((fused + "experts.gate_up_proj", (e, 2 * n, h)),), _one))),
        Recipe(t + "experts_down", (Layout(tuple(per_expert[2]), _stack),
                                    Layout(((fused + "experts.down_proj", (e, h, n)),), _one))),
    ]


class WeightMap:
    """Builds the engine's fused tensors from an HF-named state dict."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.recipes = _recipes(spec)

    def fuse(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Validate ``hf`` completely, then return {engine name: fused tensor}.

        Raises WeightMismatchError listing the first missing / unexpected / wrong-shape names.
        """
        chosen: list[tuple[Recipe, Layout]] = []
        missing: list[str] = []
        bad_shape: list[str] = []
        used: set[str] = set()
        for r in self.recipes:
            layout = next((lay for lay in r.layouts if all(n in hf for n, _ in lay.sources)), None)
            if layout is None:
                missing += [n for n, _ in r.layouts[0].sources if n not in hf]
                continue
            for name, shape in layout.sources:
                used.add(name)
                if tuple(hf[name].shape) != shape:
                    bad_shape.append(f"{name}: got {tuple(hf[name].shape)}, expected {shape}")
            chosen.append((r, layout))
        ignorable = {"lm_head.weight"} if self.spec.tie_word_embeddings else set()
        unexpected = [n for n in hf if n not in used and n not in ignorable]
        problems = [(label, names) for label, names in
                    (("missing", missing), ("unexpected", unexpected), ("wrong shape", bad_shape)) if names]
        if problems:
            parts = [f"{label} ({len(names)}): {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                     for label, names in problems]
            raise WeightMismatchError(
                f"state dict does not match the {self.spec.arch} checkpoint layout; engine weights "
                f"left untouched. " + "; ".join(parts)
                + ". Pass the HF model (or its state_dict()) of the same config.")
        with torch.no_grad():
            out = {r.target: lay.combine([hf[n].detach() for n, _ in lay.sources]) for r, lay in chosen}
        if self.spec.tie_word_embeddings:
            out["lm_head"] = out["embed"]
        return out
