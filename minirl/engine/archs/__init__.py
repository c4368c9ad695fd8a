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

_MODULES = {  # model_type -> module under minirl.engine.archs, grouped by what the family computes
    "llama": "dense", "mistral": "dense", "qwen2": "dense", "qwen3": "dense", "smollm3": "dense",
    "arcee": "dense", "seed_oss": "dense",
    "qwen3_moe": "softmax_moe", "qwen2_moe": "softmax_moe", "olmoe": "softmax_moe", "mixtral": "softmax_moe",
    "gemma": "gemma", "gemma2": "gemma", "gemma3_text": "gemma",
    "bailing_hybrid": "bailing",
}

REFUSED = {  # model_type -> what it computes that the engine does not
    "gemma3": "it is the multimodal Gemma 3 wrapper (vision tower + language_model); the engine runs its "
              "text model, a gemma3_text checkpoint (Gemma3ForCausalLM)",
    "granite": "embedding_multiplier, residual_multiplier, attention_multiplier and logits_scaling rescale the "
               "stream, the scores and the logits",
    "granitemoe": "embedding_multiplier, residual_multiplier, attention_multiplier and logits_scaling rescale the "
                  "stream, the scores and the logits",
    "cohere": "its block runs attention and MLP in parallel off one LayerNorm (not RMSNorm) and scales the "
              "logits by logit_scale",
    "stablelm": "LayerNorm with biases, partial rotary and an optional parallel residual",
    "phi3": "q/k/v and gate/up are fused on disk (qkv_proj, gate_up_proj) and it may use LongRoPE scaling",
    "glm4": "post-attention and post-MLP sandwich norms, interleaved partial RoPE and a fused gate_up_proj",
    "glm": "interleaved partial RoPE and a fused gate_up_proj",
    "gpt_oss": "attention sinks, YaRN RoPE, and clamped SwiGLU experts with biases",
    "olmo2": "post-norm blocks (norms after attention and MLP, none before) with QK-norm over the projection",
    "olmo3": "post-norm blocks (norms after attention and MLP, none before) with QK-norm over the projection",
    "starcoder2": "LayerNorm with biases and a non-gated GELU MLP (c_fc / c_proj)",
    "gpt_neox": "LayerNorm, a parallel residual, a fused query_key_value and partial rotary",
    "deepseek_v3": "multi-head latent attention with grouped sigmoid routing over n_routed_experts",
    "qwen3_next": "gated DeltaNet linear attention and gated full attention",
}
"""Families transformers builds that the engine refuses by name, with the reason (``resolve``)."""


@dataclass(frozen=True)
class Arch:
    """What the engine needs from an architecture."""

    spec: Callable[[dict], ModelSpec]
    recipes: Callable[[ModelSpec], list[Recipe]]
    model: type[Transformer]


def supported() -> list[str]:
    """The ``model_type`` values the engine loads."""
    return list(_MODULES)


def model_spec(cfg: dict) -> ModelSpec:
    """What the engine would build from a ``config.json`` dict (layers, MoE layers, vocabulary),
    without its weights: what callers outside the engine (the drill's argument checks) may read."""
    return resolve(cfg)[0]


def resolve(cfg: dict) -> tuple[ModelSpec, Arch]:
    """The spec and architecture of a ``config.json`` dict; refused and unknown families raise
    naming the family, the reason and the supported list (before any weight is read)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config.json must hold a JSON object; got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type not in _MODULES:
        why = (f"the minirl engine does not compute {model_type!r}: {REFUSED[model_type]}" if model_type in REFUSED
               else f"unsupported architecture {model_type!r} {cfg.get('architectures') or []}")
        raise ValueError(f"{why}; the minirl engine supports model_type {', '.join(_MODULES)}. Use the 'hf' "
                         f"engine (or vLLM) for other architectures.")
    check_common(cfg)
    arch: Arch = importlib.import_module(f"minirl.engine.archs.{_MODULES[model_type]}").ARCH
    try:
        return arch.spec(cfg), arch
    except KeyError as e:
        raise ValueError(f"config.json of model_type {model_type!r} lacks the field {e.args[0]!r}") from e
