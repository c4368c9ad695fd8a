"""Per-token metadata of an emitted site tensor, shared by every adapter.

Structurally the same as ``minirl.engine.tap.TapMeta`` (the engine passes its own objects
straight through); defined here so that importing aligntools never imports minirl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class TokenMetaLike(Protocol):
    request: torch.Tensor
    position: torch.Tensor
    token_id: torch.Tensor
    step: int


@dataclass(frozen=True)
class TokenMeta:
    """LongTensor [N] each: request index, absolute position, input token id; ``step`` is 0
    for prefill (or a plain forward) and k for the k-th decode step. ``valid`` (BoolTensor
    [N], or None for all): which rows are real tokens, where a forward on a device keeps its
    padding rows until the host can read which they are (``pending``)."""

    request: torch.Tensor
    position: torch.Tensor
    token_id: torch.Tensor
    step: int
    valid: torch.Tensor | None = None
