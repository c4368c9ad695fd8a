"""What every engine adapter provides to the Tracker.

An adapter knows one engine: which sites it can produce, how to hook them, how to run one
forward (or ``score``) on token ids, and the provenance to stamp on the capture. It hands
values to the Recorder already flat over tokens ([N, ...] + per-token meta), so the
Recorder never sees an engine-specific layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only: importing aligntools.tracker here closes a cycle (tracker -> adapters)
    from aligntools.tracker.recorder import Recorder


class Adapter(ABC):
    engine: str  # "hf", "minirl", "vllm", "sglang" or "module" (docs/architecture.md)

    @abstractmethod
    def available_sites(self) -> list[str]:
        """Every site this target can emit, in execution order (derived ones included)."""

    @abstractmethod
    def attach(self, recorder: Recorder) -> None:
        """Install hooks that emit ``recorder.needed`` sites into ``recorder``."""

    @abstractmethod
    def detach(self) -> None:
        """Remove every hook and patch ``attach`` installed (idempotent)."""

    @abstractmethod
    def run(self, input_ids: torch.Tensor) -> None:
        """One teacher-forced pass over ``input_ids`` [batch, seq] (no sampling)."""

    @abstractmethod
    def describe(self) -> dict:
        """Provenance attrs: ``dtype``, ``knobs`` (dict), ``model_hash``."""

    def vocab_size(self) -> int | None:
        """How many token ids the target embeds, None where unknown: ``capture`` refuses
        ids outside it before anything is written (inside the forward it would fail after
        ``out``'s journal was started again)."""
        return None
