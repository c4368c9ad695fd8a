"""minirl: a compact RL engine (inference engine, trainer, corrections, router replay)."""

from minirl.engine import Engine, Knobs, SamplingParams
from minirl.rollout import Rollout

__all__ = ["Engine", "Knobs", "Rollout", "SamplingParams"]

# RL core. ``minirl.corrections`` (tis / mis / icepop) is a public submodule.
from minirl import corrections  # noqa: E402,F401
from minirl.train_config import TrainConfig  # noqa: E402
from minirl.trainer import train  # noqa: E402
from minirl.trainer_forward import trainer_logprobs  # noqa: E402

__all__ += ["TrainConfig", "train", "trainer_logprobs"]
