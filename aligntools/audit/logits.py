"""``Logits``: the trainer's logits of the recorded tokens, held whole or as hidden states and projection.

Why not a tensor: 64 records x 256 tokens of a 49k vocabulary are 3.2 GB of fp32 logits. Past
``HOLD_ELEMENTS`` the logits are held as the final hidden states and the output projection (38 MB
there) and projected ``CHUNK_ELEMENTS`` at a time where a processor needs them; the unprocessed
logprob of each recorded token, all that most evaluations need, is computed once. Its own module
because both the scorer (which makes them) and the audit's ``State`` (which reads them) need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

CHUNK_ELEMENTS = 1 << 23
"""Logits processed at once (rows x vocabulary): bounds the float64 temporaries at 64 MB."""
HOLD_ELEMENTS = 1 << 26
"""Up to this many logits (256 MB fp32) are held as a tensor; past it, as hidden states and projection."""


@dataclass(eq=False)
class Logits:
    """The trainer's logits [N, V] of the recorded ``tokens`` [N]: ``source`` is the logits themselves, or,
    with ``weight`` [V, H] (and ``bias`` [V]), the final hidden states [N, H] they are projected from.
    ``lp`` [N] float64: log_softmax(logits)[token], computed once; ``memo``: processed logprobs by the
    processors that made them (states rebuilt with the same processors are not evaluated twice)."""

    source: torch.Tensor
    tokens: torch.Tensor
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    lp: torch.Tensor | None = None
    memo: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lp is None:
            self.lp = torch.cat([token_logprob(self[rows], self.tokens[rows]) for rows in self.chunks()])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.source), self.source.shape[1] if self.weight is None else self.weight.shape[0]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, rows: slice) -> torch.Tensor:
        """Logits [n, V] of ``rows`` (fp32, float64 for a float64 model)."""
        if self.weight is None:
            return self.source[rows]
        return nn.functional.linear(self.source[rows], self.weight, self.bias)

    def chunks(self) -> list[slice]:
        step = max(1, CHUNK_ELEMENTS // self.shape[1])
        return [slice(i, i + step) for i in range(0, len(self), step)]

    def take(self, n: int) -> Logits:
        """The first ``n`` rows (views, no copy)."""
        return Logits(self.source[:n], self.tokens[:n], self.weight, self.bias, self.lp[:n])

    def full(self) -> torch.Tensor:
        """[N, V]: every row projected (small models, tests)."""
        return self[slice(None)]


def token_logprob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits [n, V] in float64)[token] -> [n] float64."""
    return torch.log_softmax(logits.double(), -1).gather(-1, tokens[:, None])[:, 0]
