"""The token layout of one forward call: flat over valid tokens, like vLLM's varlen batches.

Why flat: padding costs GEMM work and the taps must be flat anyway (one row per (request,
position, step)). Only attention needs per-sequence structure; it gets ``pad_index`` to
scatter flat tokens into a right-padded [B, S] block (prefill) or ``context_lens`` to mask
the KV cache (decode). Every tensor lives on the device of ``token_ids`` (the engine's).

A *static* decode batch (``static_len`` set) is the shape a CUDA graph captures: it reads
``static_len`` cache positions under a mask and writes K/V by index, so neither a shape nor a
host-side value depends on the step (``engine.graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from minirl.engine.tap import TapMeta


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64, absolute position in its sequence
    request: torch.Tensor  # [N] int64, request (rollout) index for taps
    step: int  # 0 = prefill, k = k-th decode step
    decode: bool  # True: one new token per sequence, attending to the KV cache
    seq_lens: list[int]  # new tokens per sequence, in order
    cache_rows: slice | None  # rows of the KV cache these sequences occupy; None = no cache
    pad_index: torch.Tensor | None = None  # [N] flat -> b * S + s (prefill, unequal lengths)
    context_lens: torch.Tensor | None = None  # [B] tokens visible after this call (decode)
    span: tuple[int, int] | None = None  # (min, max) of ``positions`` (decode), known to the caller
    emit_rows: torch.Tensor | None = None  # rows that taps and routing capture see; None = all
    static_len: int | None = None  # static decode: cache positions every step reads (the capacity)

    @property
    def n_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_len(self) -> int:
        return max(self.seq_lens)

    @property
    def last_rows(self) -> torch.Tensor:
        """[B] flat index of each sequence's last token (whose logits predict the next one)."""
        return torch.tensor(self.seq_lens, device=self.token_ids.device).cumsum(0) - 1

    @cached_property
    def cache_index(self) -> torch.Tensor:
        """[N] KV-cache row of every token (computed once, used by every layer)."""
        assert self.cache_rows is not None
        device = self.token_ids.device
        rows = torch.arange(self.cache_rows.start, self.cache_rows.stop, device=device)
        return rows if self.decode else rows.repeat_interleave(torch.tensor(self.seq_lens, device=device))

    @property
    def uniform_position(self) -> int | None:
        """The shared position of a decode step whose rows are all at the same position (never
        for a static batch: its positions are read on the device only)."""
        if not self.decode or self.static_len is not None:
            return None
        assert self.span is not None
        return self.span[0] if self.span[0] == self.span[1] else None

    @property
    def max_context(self) -> int:
        if self.static_len is not None:
            return self.static_len
        assert self.span is not None
        return self.span[1] + 1

    @cached_property
    def decode_mask(self) -> torch.Tensor | None:
        """[B, 1, 1, L] True where a cached position is visible; None when every sequence sees
        the same length (the common case, so the attention kernel runs unmasked)."""
        lens = self.context_lens
        assert lens is not None
        if self.uniform_position is not None:
            return None
        return (torch.arange(self.max_context, device=lens.device) < lens[:, None])[:, None, None, :]

    def tap_meta(self) -> TapMeta:
        rows = self.emit_rows
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        return TapMeta(request=pick(self.request), position=pick(self.positions),
                       token_id=pick(self.token_ids), step=self.step)

    @classmethod
    def prefill(cls, seqs: list[list[int]], requests: list[int], *, cache_start: int | None,
                device: torch.device, step: int = 0, emit_last_only: bool = False) -> "ForwardBatch":
        """Whole sequences from position 0 (prompt prefill, score, or recompute-mode decode),
        built on the host and copied to ``device`` once per tensor."""
        lens = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lens])
        request = torch.tensor(requests).repeat_interleave(torch.tensor(lens))
        pad_index = None
        s_max = max(lens)
        if any(n != s_max for n in lens):
            pad_index = torch.cat([b * s_max + torch.arange(n) for b, n in enumerate(lens)]).to(device)
        ids, positions, request = ids.to(device), positions.to(device), request.to(device)
        rows = None if cache_start is None else slice(cache_start, cache_start + len(seqs))
        batch = cls(ids, positions, request, step, False, lens, rows, pad_index=pad_index)
        if emit_last_only:
            batch.emit_rows = batch.last_rows
        return batch

    @classmethod
    def decode_step(cls, tokens: torch.Tensor, positions: torch.Tensor, requests: torch.Tensor,
                    cache_rows: slice, step: int, span: tuple[int, int]) -> "ForwardBatch":
        """One new token per sequence; ``positions`` [B] is where each token goes, ``span`` their
        (min, max), which the caller tracks in Python: a decode step reads no tensor to plan."""
        b = tokens.shape[0]
        return cls(tokens, positions, requests, step, True, [1] * b, cache_rows,
                   context_lens=positions + 1, span=span)

    @classmethod
    def static_decode(cls, tokens: torch.Tensor, positions: torch.Tensor, requests: torch.Tensor,
                      capacity: int, step: int) -> "ForwardBatch":
        """One token for each of the cache rows ``0..B-1`` (``tokens``/``positions`` [B], padding
        rows included), attending over all ``capacity`` cached positions under the
        ``context_lens`` mask: the same computation for every step, as a CUDA graph needs."""
        b = tokens.shape[0]
        return cls(tokens, positions, requests, step, True, [1] * b, slice(0, b),
                   context_lens=positions + 1, static_len=capacity)
