"""minirl: a compact RL engine - inference engine with alignment knobs, GRPO-family trainer,
mismatch corrections (``minirl.corrections``: tis / mis / icepop), router replay, rollout-side
algorithms (C3PO++, GRPO-RoC, ESPO, zero-variance handling), a tool sandbox, and async / Ray
run modes (``minirl.scale_out``). Subpackages group them by concept (engine, vllm, algorithms,
tasks, sandbox, training, scale_out; docs/architecture.md); modules are public by their own names
(``minirl.sandbox.run_python``, ``minirl.algorithms.roc.roc_select``, ...); the names below are the
front door.
"""

import sys

from minirl.algorithms import advantages, corrections, espo, losses
from minirl.engine import Engine, Knobs, SamplingParams
from minirl.engine.checkpoint import read_config, read_safetensors
from minirl.engine.spec import EngineSpec
from minirl.engine.rollout import Rollout
from minirl.training.train_config import TrainConfig
from minirl.training.driver import train
from minirl.training.trainer_forward import trainer_logprobs

# Module paths earlier releases documented as public (``minirl.corrections.icepop``,
# ``minirl.losses.gspo_loss``, ``minirl.espo.espo_loss``, ``minirl.advantages.grpo_advantages``):
# the modules live in ``minirl.algorithms``; these names keep user imports working.
sys.modules.update({f"minirl.{m.__name__.rsplit('.', 1)[1]}": m for m in (advantages, corrections, espo, losses)})

__all__ = ["Engine", "EngineSpec", "Knobs", "Rollout", "SamplingParams", "TrainConfig", "read_config", "read_safetensors",
           "train", "trainer_logprobs"]
