"""The rollout-engine protocol the trainer talks to, and the minirl ``Engine`` behind a spec.

Any engine with ``generate(prompts, params) -> list[Rollout]`` (raw logprobs; routed experts
for R3) and ``load_weights(model)`` (in-place weight sync from the training model) plugs in:
pass it to ``minirl.train(config, engine=...)``, or name it in the config's ``engine`` spec.
Specs other than ``minirl`` are resolved through the ``minirl.engines`` entry-point group
(``NAME = "module:factory"``, ``factory(spec, model_path, dtype) -> engine``): that is how
``engine: vllm`` reaches real vLLM (aligntools registers it in pyproject.toml) while minirl
imports nothing of aligntools.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

import torch

from minirl import Engine, EngineSpec, Knobs, Rollout, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, model: torch.nn.Module) -> None: ...


def parse_knobs(spec: str) -> Knobs:
    """``minirl[:PRESET][,knob=value...]`` -> its validated ``Knobs`` (``EngineSpec``: the one
    engine-spec grammar)."""
    return EngineSpec.parse(spec).knobs()


def make_engine(spec: str, model_path: str | os.PathLike, dtype: str) -> RolloutEngine:
    """The rollout engine ``spec`` names over ``model_path`` in ``dtype`` (a dtype in the spec
    must agree with it): minirl's ``Engine`` with its knobs, or a registered plugin
    (``vllm[:DTYPE][,option=value...]``). The spec is parsed here, so a typo fails before any
    checkpoint is read or a plugin starts."""
    head = spec.strip().split(",")[0].partition(":")[0].strip()
    plugins = {ep.name: ep for ep in entry_points(group="minirl.engines")}
    if head != "minirl" and head not in plugins:
        known = ", ".join(["minirl", *sorted(plugins)])
        raise ValueError(f"engine spec {spec!r}: unknown engine {head!r}; engines here: {known} (plugins come from "
                         f"the 'minirl.engines' entry points of installed packages; `make` installs this "
                         f"project's, which adds vllm)")
    if head not in EngineSpec.KINDS:  # a third-party plugin reads its own spec
        return plugins[head].load()(spec, model_path, dtype)
    parsed = EngineSpec.parse(spec)
    dtype = parsed.engine_dtype(dtype)
    if parsed.kind == "minirl":
        return Engine.from_pretrained(model_path, dtype, parsed.knobs())
    return plugins[parsed.kind].load()(str(parsed), model_path, dtype)
