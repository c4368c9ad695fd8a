"""The rollout-engine protocol the trainer talks to, and the minirl ``Engine`` behind a spec.

Any engine with ``generate(prompts, params) -> list[Rollout]`` (raw logprobs; routed experts
for R3) and ``load_weights(model)`` (in-place weight sync from the training model) plugs in:
pass it to ``minirl.train(config, engine=...)``, or name it in the config's ``engine`` spec.
``minirl`` and ``vllm`` specs are minirl's own (``minirl.engine``, ``minirl.vllm``); any other
name is looked up in the ``minirl.engines`` entry-point group (``NAME = "module:factory"``,
``factory(spec, model_path, dtype) -> engine``), the door for third-party engines.

One card: the minirl ``Engine`` is built on the trainer's device (``TrainConfig.device``), so
rollouts, the trainer's forward and the weight sync share one GPU and the sync is a
device-to-device copy with no trip through host memory. It stays a copy, never an alias of the
trainer's parameters: the engine fuses qkv, gate/up and the experts into its own tensors, rounds
them to its weight dtype (and ``Knobs.weights`` quantizes them), and keeps their addresses fixed
across syncs (a captured CUDA graph reads them there); only the norms and embeddings of an fp32,
unquantized engine could alias, too few to be worth a second path. The trainer logs the copy's
time as ``time_sync``. vLLM (the CPU build) and third-party engines choose their own device.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

import torch

from minirl.engine.engine import Engine
from minirl.engine.knobs import Knobs
from minirl.engine.rollout import Rollout
from minirl.engine.sampling import SamplingParams
from minirl.engine.spec import EngineSpec


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, model: torch.nn.Module) -> None: ...


def parse_knobs(spec: str) -> Knobs:
    """``minirl[:PRESET][,knob=value...]`` -> its validated ``Knobs`` (``EngineSpec``: the one
    engine-spec grammar)."""
    return EngineSpec.parse(spec).knobs()


def make_engine(spec: str, model_path: str | os.PathLike, dtype: str,
                device: str | torch.device = "cpu") -> RolloutEngine:
    """The rollout engine ``spec`` names over ``model_path`` in ``dtype`` (a dtype in the spec
    must agree with it): minirl's ``Engine`` with its knobs on ``device`` (the trainer's), or a
    registered plugin (``vllm[:DTYPE][,option=value...]``). The spec is parsed here, so a typo
    fails before any checkpoint is read or a plugin starts."""
    head = spec.strip().split(",")[0].partition(":")[0].strip()
    plugins = {ep.name: ep for ep in entry_points(group="minirl.engines")}
    own = ("minirl", "vllm")
    if head not in own and head not in plugins:
        known = ", ".join([*own, *sorted(plugins)])
        raise ValueError(f"engine spec {spec!r}: unknown engine {head!r}; engines here: {known} (others come from "
                         f"the 'minirl.engines' entry points of installed packages)")
    if head not in own:  # a third-party plugin reads its own spec
        return plugins[head].load()(spec, model_path, dtype)
    parsed = EngineSpec.parse(spec)
    if parsed.kind == "vllm":
        from minirl.vllm.rollouts import VllmRollouts  # imports vLLM: only when asked for

        return VllmRollouts.from_spec(str(parsed), model_path, dtype)
    return Engine.from_pretrained(model_path, parsed.engine_dtype(dtype), parsed.knobs(), device=device)
