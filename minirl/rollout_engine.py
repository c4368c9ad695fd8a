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
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"engine spec {spec!r}: {pair!r} is not knob=value")
    options = spec_options(spec, pairs)
    changes = {key: Knobs.parse_value(key, value) for key, value in options.items()}  # the one knob parser
    return Knobs.preset(preset or "typical").replace(**changes).validate()


def spec_options(spec: str, items: list[str]) -> dict[str, str]:
    """``["tp=2", "rmsnorm = hf"]`` -> ``{"tp": "2", "rmsnorm": "hf"}``: the ``key=value`` items
    of an engine spec (each already checked to hold a ``=``), keys and values stripped.

    Every engine-spec parser reads its options here so that a repeated key is refused alike
    everywhere: in a dict the last one would win without a word (``tp=2,tp=4`` ran tp=4)."""
    pairs = [(key.strip(), value.strip()) for key, _, value in (item.partition("=") for item in items)]
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            given = ",".join(f"{k}={v}" for k, v in pairs if k == key)
            raise ValueError(f"engine spec {spec!r} sets option {key!r} more than once ({given}); give each "
                             f"option once")
        out[key] = value
    return out


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
