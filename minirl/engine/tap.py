"""Explicit observation points of the minirl engine (what the aligntools Tracker hooks).

The engine calls every registered tap at each site of docs/sites.md, in prefill and
in every decode step. Why explicit taps instead of forward hooks: the engine's modules are
fused (qkv, gate_up, add+norm), so the interesting values are *inside* a module; the engine
knows where they are and emits them already un-fused, flat over valid tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass(frozen=True)
class TapMeta:
    """Per-token metadata for one emitted tensor (all LongTensor [N], padding removed).

    ``request`` indexes the engine call's sequences (for generate: the rollout index),
    ``position`` is the absolute position in that sequence, ``token_id`` the input token at
    that position, ``step`` is 0 for prefill and k for the k-th decode step.
    """

    request: torch.Tensor
    position: torch.Tensor
    token_id: torch.Tensor
    step: int


class Tap(Protocol):
    def __call__(self, site: str, value: torch.Tensor, meta: TapMeta) -> None:
        """``value`` is [N, ...] in the dtype the engine computed it in (e.g.
        ``logits`` in ``lm_head_dtype``); do not modify it in place."""


class TapHandle:
    """Returned by ``Engine.add_tap``; ``remove()`` detaches the tap."""

    def __init__(self, taps: list[Callable], tap: Callable) -> None:
        self._taps, self._tap = taps, tap

    def remove(self) -> None:
        if self._tap in self._taps:
            self._taps.remove(self._tap)
