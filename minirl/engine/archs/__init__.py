"""Architecture registry (vLLM-style): ``model_type`` -> the one module that knows it.

Each architecture module defines ``ARCH``: how its ``config.json`` becomes a ``ModelSpec``, the
recipes that build the engine's fused tensors from its HF weights, and the model class that
runs it. Modules are imported only when a checkpoint of theirs is loaded, so the engine's
layers (``config``, ``weight_map``, ``model``) never import an architecture.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from minirl.engine.config import ModelSpec, check_common
from minirl.engine.model import Transformer
from minirl.engine.weight_map import Recipe

_MODULES = {  # model_type -> module under minirl.engine.archs
    "llama": "dense",
    "qwen2": "dense",
    "qwen3": "dense",
    "qwen3_moe": "softmax_moe",
    "mixtral": "softmax_moe",
    "bailing_hybrid": "bailing",
}


@dataclass(frozen=True)
class Arch:
    """What the engine needs from an architecture."""

    spec: Callable[[dict], ModelSpec]
    recipes: Callable[[ModelSpec], list[Recipe]]
    model: type[Transformer]


def supported() -> list[str]:
    """The ``model_type`` values the engine loads."""
    return list(_MODULES)


def resolve(cfg: dict) -> tuple[ModelSpec, Arch]:
    """The spec and architecture of a ``config.json`` dict; unsupported ones raise naming the
    supported list (before any weight is read)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config.json must hold a JSON object; got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type not in _MODULES:
        raise ValueError(f"unsupported architecture {model_type!r} {cfg.get('architectures') or []}; the "
                         f"minirl engine supports model_type {', '.join(_MODULES)}. Use the 'hf' engine for "
                         f"other architectures.")
    check_common(cfg)
    arch: Arch = importlib.import_module(f"minirl.engine.archs.{_MODULES[model_type]}").ARCH
    try:
        return arch.spec(cfg), arch
    except KeyError as e:
        raise ValueError(f"config.json of model_type {model_type!r} lacks the field {e.args[0]!r}") from e
