"""Replayer: re-run one module on captured inputs under another implementation, and attribute
the train-inference gap to engine knobs."""

from aligntools.replayer.attribution import Attribution, attribute
from aligntools.replayer.module_replay import ReplayResult, replay

__all__ = ["Attribution", "ReplayResult", "attribute", "replay"]
