"""What the audit knows (``Context``) and the trainer-side model of the engine it builds (``State``).

Why a state: causes compose. An engine may sample at T = 0.7 *and* with top-p 0.9 and return the
processed logprobs; once temperature is found, top-p must be fitted on the tempered distribution.
A ``State`` is the trainer's logits (re-scored when a cause changes the input or the weights), the
logit processors found so far (applied in the engines' order) and an index shift; its
``logprobs()`` are what the engine would have returned if exactly those causes were at work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from aligntools.records import Record

STAGES = ("penalty", "temperature", "top_k", "top_p", "min_p")
"""The order in which vLLM and SGLang process logits before sampling (penalties, temperature, then the
truncations), so a processor found later is still applied where the engine applied it."""

Processor = Callable[[torch.Tensor, slice], torch.Tensor]
"""(logits [n, V] float64 of the rows ``rows``, rows) -> processed logits [n, V]."""
CHUNK_ROWS = 256
"""Rows processed at once by ``State.logprobs``: bounds its float64 temporaries at 256 x V."""


@dataclass
class Context:
    """The records and the trainer: engine logprobs, tokens and their owners, flattened over records.

    ``engine``, ``tokens``, ``owner`` (record index), ``position`` (index in the completion): [N].
    ``rescore(prompts, forced=None)`` scores the records' completions after other prompts with the
    trainer (or with forced routing); ``old`` are candidate checkpoints of ``stale_weights``.
    """

    records: list[Record]
    model: nn.Module
    engine: torch.Tensor
    tokens: torch.Tensor
    owner: torch.Tensor
    position: torch.Tensor
    vocab: int
    old: tuple = ()
    routing: list[np.ndarray] | None = None
    margins: list[np.ndarray] | None = None
    cache: dict = field(default_factory=dict)
    """Re-scored logits by key (a prompt variant, an old checkpoint, the replayed routing)."""

    @classmethod
    def of(cls, records: list[Record], model: nn.Module, vocab: int, old: tuple = ()) -> Context:
        owner = [i for i, r in enumerate(records) for _ in r.completion_ids]
        return cls(records, model, torch.tensor([x for r in records for x in r.logprobs], dtype=torch.float64),
                   torch.tensor([t for r in records for t in r.completion_ids]), torch.tensor(owner),
                   torch.tensor([t for r in records for t in range(len(r.completion_ids))]), vocab, old)

    def rescore(self, key: str, prompts: list, forced: list[np.ndarray] | None = None,
                load: Callable[[], nn.Module] | None = None) -> torch.Tensor:
        """Logits [N, V] of the recorded completions after ``prompts``, scored by the trainer (or the
        model ``load()`` returns), cached under ``key``."""
        from aligntools.audit.score import score

        if key not in self.cache:
            completions = [r.completion_ids for r in self.records]
            self.cache[key] = score(load() if load else self.model, prompts, completions, forced).logits
        return self.cache[key]

    def seen(self, rows: slice) -> torch.Tensor:
        """[n, V] bool for ``rows``: the token appeared in the prompt or earlier in the completion
        (repetition penalty)."""
        owner, position = self.owner[rows].tolist(), self.position[rows].tolist()
        seen = torch.zeros(len(owner), self.vocab, dtype=torch.bool)
        for n, (i, t) in enumerate(zip(owner, position)):
            r = self.records[i]
            seen[n, list(r.prompt_ids) + list(r.completion_ids[:t])] = True
        return seen

    def counts(self, rows: slice) -> torch.Tensor:
        """[n, V] float64 for ``rows``: how often the token appeared earlier in the completion
        (presence/frequency penalty)."""
        owner, position = self.owner[rows].tolist(), self.position[rows].tolist()
        counts = torch.zeros(len(owner), self.vocab, dtype=torch.float64)
        for n, (i, t) in enumerate(zip(owner, position)):
            ids = torch.tensor(self.records[i].completion_ids[:t], dtype=torch.long)
            counts[n].index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64))
        return counts

    def head(self, tokens: int) -> tuple[Context, int]:
        """(the context of the first records holding at most ``tokens`` tokens (one record at least),
        their token count): the causes are fitted there, then applied to every record."""
        n = k = 0
        while k < len(self.records) and (k == 0 or n + len(self.records[k].completion_ids) <= tokens):
            n += len(self.records[k].completion_ids)
            k += 1
        if k == len(self.records):
            return self, n
        sub = Context.of(self.records[:k], self.model, self.vocab, self.old)
        sub.routing = None if self.routing is None else self.routing[:k]
        sub.margins = None if self.margins is None else self.margins[:k]
        return sub, n


@dataclass(frozen=True)
class State:
    """The trainer-side model of the engine: ``logits`` [N, V] float32, ``processors`` by stage,
    ``shift`` (the engine's logprob at token t is the model's at t + shift, within a record)."""

    logits: torch.Tensor
    tokens: torch.Tensor
    owner: torch.Tensor
    processors: tuple[tuple[str, Processor], ...] = ()
    shift: int = 0

    def processed(self, until: str | None = None, rows: slice = slice(None)) -> torch.Tensor:
        """[n, V] float64 logits of ``rows`` after the processors of the stages before ``until`` (all if None)."""
        z = self.logits[rows].double()
        found = dict(self.processors)
        for stage in STAGES[: STAGES.index(until) if until else len(STAGES)]:
            if stage in found:
                z = found[stage](z, rows)
        return z

    def logprobs(self) -> torch.Tensor:
        """[N] float64: the modelled engine logprob of each recorded token (``CHUNK_ROWS`` rows at a time)."""
        lp = torch.cat([torch.log_softmax(self.processed(rows=rows), -1).gather(-1, self.tokens[rows, None])[:, 0]
                        for rows in (slice(i, i + CHUNK_ROWS) for i in range(0, len(self.tokens), CHUNK_ROWS))])
        if not self.shift:
            return lp
        src = torch.arange(len(lp)) + self.shift
        ok = (src >= 0) & (src < len(lp))
        ok[ok.clone()] = self.owner[src[ok]] == self.owner[ok]
        return torch.where(ok, lp[src.clamp(0, len(lp) - 1)], lp)

    def with_processor(self, stage: str, fn: Processor) -> State:
        return dataclasses.replace(self, processors=(*(p for p in self.processors if p[0] != stage), (stage, fn)))

    def with_logits(self, logits: torch.Tensor) -> State:
        return dataclasses.replace(self, logits=logits)

    def with_shift(self, shift: int) -> State:
        return dataclasses.replace(self, shift=shift)


def gap(ctx: Context, state: State) -> float:
    """Mean |engine logprob - modelled logprob| over all recorded tokens, in nats."""
    return float((ctx.engine - state.logprobs()).abs().mean())
