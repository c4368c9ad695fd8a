"""minirl: a compact RL engine (inference engine, trainer, corrections, router replay)."""

from minirl.engine import Engine, Knobs, Rollout, SamplingParams

__all__ = ["Engine", "Knobs", "Rollout", "SamplingParams"]
