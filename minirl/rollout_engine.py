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

from minirl import Engine, Knobs, Rollout, SamplingParams

@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, model: torch.nn.Module) -> None: ...


def parse_knobs(spec: str) -> Knobs:
    """``minirl[:PRESET][,knob=value...]`` -> ``Knobs`` (values typed like the field's default)."""
    head, *pairs = [p.strip() for p in spec.split(",")]
    name, _, preset = head.partition(":")
    if name != "minirl":
        raise ValueError(f"engine spec {spec!r} is not a minirl spec: 'minirl[:PRESET][,knob=value...]'")
    changes: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"engine spec {spec!r}: {pair!r} is not knob=value")
        changes[key.strip()] = Knobs.parse_value(key.strip(), value.strip())  # the one knob parser
    return Knobs.preset(preset or "typical").replace(**changes).validate()


def make_engine(spec: str, model_path: str | os.PathLike, dtype: str) -> RolloutEngine:
    """The rollout engine ``spec`` names over ``model_path``: minirl's ``Engine`` with its knobs,
    or a registered plugin (``vllm[:DTYPE][,option=value...]``)."""
    name = spec.strip().split(",")[0].partition(":")[0].strip()
    if name == "minirl":
        return Engine.from_pretrained(model_path, dtype, parse_knobs(spec))
    plugins = {ep.name: ep for ep in entry_points(group="minirl.engines")}
    if name not in plugins:
        known = ", ".join(["minirl", *sorted(plugins)])
        raise ValueError(f"engine spec {spec!r}: unknown engine {name!r}; engines here: {known} (plugins come from "
                         f"the 'minirl.engines' entry points of installed packages; `make` installs this "
                         f"project's, which adds vllm)")
    return plugins[name].load()(spec, model_path, dtype)
