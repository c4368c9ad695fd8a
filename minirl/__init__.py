"""minirl: a compact RL engine - inference engine with alignment knobs, GRPO-family trainer,
mismatch corrections (``minirl.algorithms.corrections``: tis / mis / icepop), router replay, rollout-side
algorithms (C3PO++, GRPO-RoC, ESPO, zero-variance handling), a tool sandbox, and async / Ray
run modes (``minirl.scale_out``). Subpackages group them by concept (engine, vllm, algorithms,
tasks, sandbox, training, scale_out; docs/architecture.md); modules are public by their own names
(``minirl.sandbox.run_python``, ``minirl.algorithms.roc.roc_select``, ...); the names below are the
front door.

The front door opens on first use (PEP 562): a process that needs one torch-free module, such as
a Ray actor of the transfer queue, does not pay the ~4 s of importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {"Engine": "minirl.engine", "Knobs": "minirl.engine", "SamplingParams": "minirl.engine",
            "EngineSpec": "minirl.engines", "build_engine": "minirl.engines", "engine_kind": "minirl.engines",
            "Rollout": "minirl.engine.rollout",
            "fake_quantize": "minirl.engine.quantize", "unfit": "minirl.engine.quantize",
            "model_spec": "minirl.engine.archs", "read_config": "minirl.engine.checkpoint", "read_safetensors": "minirl.engine.checkpoint",
            "TrainConfig": "minirl.training.train_config", "train": "minirl.driver",
            "trainer_logprobs": "minirl.training.trainer_forward",
            "check_output_file": "minirl.output_paths", "temp_sibling": "minirl.output_paths",
            "check_directory_takes_files": "minirl.output_paths", "OutputPathError": "minirl.output_paths"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minirl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from minirl.engine import Engine, Knobs, SamplingParams
    from minirl.engine.archs import model_spec
    from minirl.engine.checkpoint import read_config, read_safetensors
    from minirl.engine.rollout import Rollout
    from minirl.engines import EngineSpec, build_engine, engine_kind
    from minirl.output_paths import OutputPathError, check_directory_takes_files, check_output_file, temp_sibling
    from minirl.driver import train
    from minirl.training.train_config import TrainConfig
    from minirl.training.trainer_forward import trainer_logprobs
