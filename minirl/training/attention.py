"""The trainer's attention kernel (``TrainConfig.trainer_attention``), resolved per model.

Why ``auto``: transformers refuses ``sdpa`` for families whose model class says
``_supports_sdpa = False`` (Gemma 2's soft-capped scores, gpt-oss's attention sinks), so a fixed
``sdpa`` default made every run of those families exit 2. ``auto`` takes ``sdpa`` where the
class has it and ``eager`` where it does not. A run records the kernel it resolved to, never
``auto``: its saved config names what computed its steps, and a resume whose ``auto`` resolves
to the saved kernel changes nothing (one that resolves elsewhere is refused as any change is).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from minirl.training.train_config import TrainConfig


def resolve(choice: str, model: str | os.PathLike) -> str:
    """``choice`` (``auto``, ``sdpa`` or ``eager``) for checkpoint ``model``: ``auto`` -> ``sdpa``
    where its transformers class supports it, else ``eager``; the others as they are."""
    if choice != "auto":
        return choice
    return "sdpa" if causal_lm_class(model)._supports_sdpa else "eager"


def resolved(config: TrainConfig) -> TrainConfig:
    """``config`` with ``trainer_attention`` resolved for its model. Left ``auto`` when the model
    has no ``config.json`` yet: the trainer refuses that by name before it loads anything."""
    if config.trainer_attention != "auto" or not (Path(config.model) / "config.json").is_file():
        return config
    return dataclasses.replace(config, trainer_attention=resolve("auto", config.model))


def causal_lm_class(model: str | os.PathLike) -> type:
    """The transformers class ``AutoModelForCausalLM`` builds for checkpoint ``model``."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(model)
    try:
        return transformers.AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        raise ValueError(f"{model}: transformers has no causal-LM class for model_type {config.model_type!r}, "
                         f"so the trainer cannot load it; use a checkpoint of a causal LM") from None
