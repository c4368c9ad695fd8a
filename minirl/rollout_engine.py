"""The rollout-engine protocol the trainer talks to, and the minirl ``Engine`` behind a spec.

Any engine with ``generate(prompts, params) -> list[Rollout]`` (raw logprobs; routed experts
for R3) and ``load_weights(model)`` (in-place weight sync from the training model) plugs in;
a vLLM adapter only has to provide these two methods.
"""

from __future__ import annotations

import os
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
        raise ValueError(f"engine spec {spec!r}: only 'minirl[:PRESET][,knob=value...]' is built in; pass "
                         f"another engine object to minirl.train(config, engine=...), e.g. real vLLM: "
                         f"aligntools.adapters.vllm_rollouts.VllmRollouts.create(path, 'bfloat16')")
    changes: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"engine spec {spec!r}: {pair!r} is not knob=value")
        changes[key.strip()] = Knobs.parse_value(key.strip(), value.strip())  # the one knob parser
    return Knobs.preset(preset or "typical").replace(**changes).validate()


def make_engine(spec: str, model_path: str | os.PathLike, dtype: str) -> RolloutEngine:
    """The minirl inference engine over ``model_path`` with the knobs ``spec`` names."""
    return Engine.from_pretrained(model_path, dtype, parse_knobs(spec))
