"""What the audit knows (``Context``) and the trainer-side model of the engine it builds (``State``).

Why a state: causes compose. An engine may sample at T = 0.7 *and* with top-p 0.9 and return the
processed logprobs; once temperature is found, top-p must be fitted on the tempered distribution.
A ``State`` is the trainer's logits (re-scored when a cause changes the input or the weights), the
logit processors found so far (applied in the engines' order) and an index shift; its
``logprobs()`` are what the engine would have returned if exactly those causes were at work.

The trainer's logits are a ``Logits`` (``aligntools.audit.logits``): held whole, or as hidden states
and projection past a size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from aligntools.audit.logits import Logits, token_logprob
from aligntools.records import Record

STAGES = ("penalty", "temperature", "top_k", "top_p", "min_p")
"""The order in which vLLM and SGLang process logits before sampling (penalties, temperature, then the
truncations), so a processor found later is still applied where the engine applied it. A
``temperature`` processor must be elementwise (the penalty fit applies it to the seen tokens alone)."""

Processor = Callable[[torch.Tensor, slice], torch.Tensor]
"""(logits [n, V] float64 of the rows ``rows``, rows) -> processed logits [n, V]."""
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
    """Re-scored logits by key (a prompt variant, an old checkpoint, the replayed routing), fitted processors."""

    @classmethod
    def of(cls, records: list[Record], model: nn.Module, vocab: int, old: tuple = ()) -> Context:
        owner = [i for i, r in enumerate(records) for _ in r.completion_ids]
        return cls(records, model, torch.tensor([x for r in records for x in r.logprobs], dtype=torch.float64),
                   torch.tensor([t for r in records for t in r.completion_ids]), torch.tensor(owner),
                   torch.tensor([t for r in records for t in range(len(r.completion_ids))]), vocab, old)

    def rescore(self, key: str, prompts: list, forced: list[np.ndarray] | None = None,
                load: Callable[[], nn.Module] | None = None) -> Logits:
        """Logits [N, V] of the recorded completions after ``prompts``, scored by the trainer (or the
        model ``load()`` returns), cached under ``key``."""
        from aligntools.audit.score import score

        if key not in self.cache:
            completions = [r.completion_ids for r in self.records]
            self.cache[key] = score(load() if load else self.model, prompts, completions, forced).rows
        return self.cache[key]

    def seen(self, rows: slice) -> torch.Tensor:
        """[n, V] bool for ``rows``: the token appeared in the prompt or earlier in the completion
        (repetition penalty)."""
        seen = torch.zeros(len(self.tokens[rows]), self.vocab, dtype=torch.bool)
        for n, ids in enumerate(self.history(rows, prompt=True)):
            seen[n, ids] = True
        return seen

    def counts(self, rows: slice) -> torch.Tensor:
        """[n, V] float64 for ``rows``: how often the token appeared earlier in the completion
        (presence/frequency penalty)."""
        counts = torch.zeros(len(self.tokens[rows]), self.vocab, dtype=torch.float64)
        for n, ids in enumerate(self.history(rows, prompt=False)):
            counts[n].index_add_(0, torch.tensor(ids, dtype=torch.long), torch.ones(len(ids), dtype=torch.float64))
        return counts

    def history(self, rows: slice, prompt: bool) -> list[list[int]]:
        """Per row, the tokens before it: the earlier completion tokens (and the prompt with ``prompt``)."""
        out = []
        for i, t in zip(self.owner[rows].tolist(), self.position[rows].tolist()):
            r = self.records[i]
            out.append([*(r.prompt_ids if prompt else ()), *r.completion_ids[:t]])
        return out

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
    """The trainer-side model of the engine: ``logits`` (``Logits``, or a [N, V] tensor it wraps),
    ``processors`` by stage, ``shift`` (the engine's logprob at token t is the model's at t + shift,
    within a record)."""

    logits: Logits
    tokens: torch.Tensor
    owner: torch.Tensor
    processors: tuple[tuple[str, Processor], ...] = ()
    shift: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.logits, Logits):
            object.__setattr__(self, "logits", Logits(self.logits, self.tokens))

    def processed(self, until: str | None = None, rows: slice = slice(None)) -> torch.Tensor:
        """[n, V] float64 logits of ``rows`` after the processors of the stages before ``until`` (all if None)."""
        return self.apply(self.logits[rows].double(), rows, *STAGES[: STAGES.index(until) if until else len(STAGES)])

    def apply(self, z: torch.Tensor, rows: slice, *stages: str) -> torch.Tensor:
        """Logits ``z`` [n, ...] of ``rows`` through this state's processors of ``stages``, in the engines' order."""
        found = dict(self.processors)
        for stage in STAGES:
            if stage in stages and stage in found:
                z = found[stage](z, rows)
        return z

    def logprobs(self) -> torch.Tensor:
        """[N] float64: the modelled engine logprob of each recorded token (``CHUNK_ELEMENTS`` at a time)."""
        key = tuple(sorted(self.processors, key=lambda p: STAGES.index(p[0])))
        if key not in self.logits.memo:
            self.logits.memo[key] = torch.cat([token_logprob(self.processed(rows=rows), self.tokens[rows])
                                               for rows in self.logits.chunks()]) if key else self.logits.lp
        return shifted(self.logits.memo[key], self.shift, self.owner)

    def with_processor(self, stage: str, fn: Processor) -> State:
        return dataclasses.replace(self, processors=(*(p for p in self.processors if p[0] != stage), (stage, fn)))

    def with_logits(self, logits: Logits | torch.Tensor) -> State:
        return dataclasses.replace(self, logits=logits)

    def with_shift(self, shift: int) -> State:
        return dataclasses.replace(self, shift=shift)


def shifted(lp: torch.Tensor, shift: int, owner: torch.Tensor) -> torch.Tensor:
    """``lp`` [N] read at t + ``shift`` within each record (the own value where t + shift leaves it)."""
    if not shift:
        return lp
    src = torch.arange(len(lp)) + shift
    ok = (src >= 0) & (src < len(lp))
    ok[ok.clone()] = owner[src[ok]] == owner[ok]
    return torch.where(ok, lp[src.clamp(0, len(lp) - 1)], lp)


def gap(ctx: Context, state: State) -> float:
    """Mean |engine logprob - modelled logprob| over all recorded tokens, in nats."""
    return float((ctx.engine - state.logprobs()).abs().mean())


def gap_of(ctx: Context, state: State, lp: torch.Tensor) -> float:
    """``gap`` for the unshifted modelled logprobs ``lp`` [N] a fit computed itself, read with ``state``'s shift."""
    return float((ctx.engine - shifted(lp, state.shift, state.owner)).abs().mean())
