"""The rollout-engine protocol the trainer talks to, and the minirl ``Engine`` behind a spec.

Any engine with ``generate(prompts, params) -> list[Rollout]`` (raw logprobs; routed experts
for R3) and ``load_weights(model)`` (in-place weight sync from the training model) plugs in;
a vLLM adapter only has to provide these two methods.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Protocol, runtime_checkable

import torch

from minirl import Engine, Knobs, Rollout, SamplingParams

PRESETS = {"typical": Knobs.typical_inference, "aligned": Knobs.aligned, "hf_exact": Knobs.hf_exact}


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, model: torch.nn.Module) -> None: ...


def parse_knobs(spec: str) -> Knobs:
    """``minirl[:PRESET][,knob=value...]`` -> ``Knobs`` (values typed like the field's default)."""
    head, *pairs = [p.strip() for p in spec.split(",")]
    name, _, preset = head.partition(":")
    if name != "minirl":
        raise ValueError(f"engine spec {spec!r}: only 'minirl[:PRESET][,knob=value...]' is built in; "
                         f"pass another engine object to minirl.train(config, engine=...)")
    preset = preset or "typical"
    if preset not in PRESETS:
        raise ValueError(f"engine preset {preset!r}; valid: {', '.join(PRESETS)}")
    knobs = PRESETS[preset]()
    fields = {f.name: getattr(knobs, f.name) for f in dataclasses.fields(knobs)}
    changes: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"engine spec {spec!r}: {pair!r} is not knob=value")
        if key not in fields:
            raise ValueError(f"engine spec {spec!r}: unknown knob {key!r}; valid: {', '.join(fields)}")
        changes[key] = _typed(value, fields[key])
    return knobs.replace(**changes)


def make_engine(spec: str, model_path: str | os.PathLike, dtype: str) -> RolloutEngine:
    """The minirl inference engine over ``model_path`` with the knobs ``spec`` names."""
    return Engine.from_pretrained(model_path, dtype, parse_knobs(spec))


def _typed(value: str, default: object) -> object:
    if isinstance(default, bool):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"expected true/false, got {value!r}")
        return value.lower() == "true"
    if isinstance(default, int):
        return int(value)
    if default is None:
        return None if value.lower() == "none" else float(value)
    return value
