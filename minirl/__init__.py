"""minirl: a compact RL engine (inference engine, trainer, corrections, router replay)."""

from minirl.engine import Engine, Knobs, SamplingParams
from minirl.rollout import Rollout

__all__ = ["Engine", "Knobs", "Rollout", "SamplingParams"]
