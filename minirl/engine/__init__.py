"""minirl's inference engine: rollouts for RL and the inference side of alignment checks."""

from minirl.engine.engine import Engine
from minirl.engine.knobs import Knobs
from minirl.engine.sampling import SamplingParams
from minirl.engine.tap import TapHandle, TapMeta

__all__ = ["Engine", "Knobs", "SamplingParams", "TapHandle", "TapMeta"]
