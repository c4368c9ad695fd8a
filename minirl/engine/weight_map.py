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


def one(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0]


def cat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(ts, dim=0)


def stack(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(ts, dim=0)


def stack_gate_up(ts: list[torch.Tensor]) -> torch.Tensor:
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


def single(target: str, name: str, shape: Shape) -> Recipe:
    """An engine tensor that is one HF tensor as is."""
    return Recipe(target, (Layout(((name, shape),), one),))


class WeightMap:
    """Builds the engine's fused tensors from an HF-named state dict, following the recipes of
    the checkpoint's architecture (``minirl.engine.archs``)."""

    def __init__(self, spec: ModelSpec, recipes: list[Recipe]) -> None:
        self.spec = spec
        self.recipes = recipes

    def fuse(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Validate ``hf`` completely, then return {engine name: fused tensor}.

        Raises WeightMismatchError listing the first missing / unexpected / wrong-shape names.
        """
        not_tensors = [n for n, v in hf.items() if not isinstance(v, torch.Tensor)]
        meta = [n for n, v in hf.items() if isinstance(v, torch.Tensor) and v.is_meta]
        if not_tensors or meta:
            what = (f"{len(not_tensors)} entries are not tensors ({', '.join(not_tensors[:3])})" if not_tensors
                    else f"{len(meta)} tensors are on the meta device and hold no data ({', '.join(meta[:3])})")
            raise WeightMismatchError(f"cannot load weights: {what}; engine weights left untouched. Pass a "
                                      f"materialised model or state dict.")
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
