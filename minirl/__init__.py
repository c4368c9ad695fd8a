"""minirl: a compact RL engine - inference engine with alignment knobs, GRPO-family trainer,
mismatch corrections (``minirl.corrections``: tis / mis / icepop), router replay, rollout-side
algorithms (C3PO++, GRPO-RoC, ESPO, zero-variance handling), a tool sandbox, and async / Ray
run modes (``minirl.async_loop``). Submodules are public by their own names
(``minirl.sandbox.run_python``, ``minirl.roc.roc_select``, ...); the names below are the front door.
"""

from minirl import corrections  # noqa: F401  (public submodule: minirl.corrections.icepop, ...)
from minirl.engine import Engine, Knobs, SamplingParams
from minirl.engine.checkpoint import read_config, read_safetensors
from minirl.engine.spec import EngineSpec
from minirl.rollout import Rollout
from minirl.train_config import TrainConfig
from minirl.driver import train
from minirl.trainer_forward import trainer_logprobs

__all__ = ["Engine", "EngineSpec", "Knobs", "Rollout", "SamplingParams", "TrainConfig", "read_config", "read_safetensors",
           "train", "trainer_logprobs"]
