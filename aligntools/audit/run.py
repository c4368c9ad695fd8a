"""``audit(records, model)``: semantic causes first, then the numeric remainder.

Why this order: a semantic bug (temperature on one side, a truncated distribution, a shifted list,
another prompt, stale weights) looks like a large numeric mismatch to every per-token metric. Each
one has a signature the trainer can reproduce exactly; only what no signature explains is numeric.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from aligntools.audit import inputs, precision, routing, sampling  # noqa: F401 - registers the causes, in the order tested
from aligntools.audit.numeric import FLOOR_RECORDS, FLOOR_TOKENS, limit, remainder
from aligntools.audit.registry import ACCEPT, CAUSES, Fit
from aligntools.audit.result import AuditResult, Cause
from aligntools.audit.score import load_model, score
from aligntools.audit.state import Context, State, gap
from aligntools.records import Record, RecordError, read

Model = str | os.PathLike | nn.Module
FIT_TOKENS = 2048
"""Causes are fitted on the first records holding this many tokens (a semantic cause is systematic:
a few thousand tokens pin T, p or k), then applied to all records for the shares and the remainder."""
FIT_ELEMENTS = 1 << 24
"""...and at most this many logits (tokens x vocabulary): a fit evaluation is a pass over them, so a 49k
vocabulary fits on ~340 tokens (one record at least) where a 512 one keeps ``FIT_TOKENS``."""
BACKFIT_PASSES = 3
"""Coordinate-descent passes over the causes found; two causes (T and top-p) settle in two or three."""


def audit(records: Iterable[Record] | str | os.PathLike, model: Model, old: Sequence[Model] = (),
          progress: bool = False) -> AuditResult:
    """Score ``records`` with ``model`` (HF checkpoint directory or module, in fp32) and name why the
    engine's logprobs differ: ``.verdict`` ("aligned" | "misaligned") and ``.causes`` by share.
    ``old``: candidate checkpoints the engine may have served (cause ``stale_weights``). ``progress``:
    bars on stderr for the long parts (the trainer's forward, each round of causes, the fingerprint)."""
    recs = read(records) if isinstance(records, (str, os.PathLike)) else list(records)
    if not recs or not all(isinstance(r, Record) for r in recs):
        raise RecordError("audit: give a records file or a non-empty list of aligntools.records.Record")
    trainer = load_model(model)
    _check_vocab(recs, trainer)
    scores = score(trainer, [r.prompt_ids for r in recs], [r.completion_ids for r in recs], progress=progress)
    ctx = Context.of(recs, trainer, scores.rows.shape[1], tuple(old))
    ctx.routing, ctx.margins = scores.routing, scores.margins
    start = State(scores.rows, ctx.tokens, ctx.owner)
    floor, lim = _floor(ctx, model, start)
    g0 = gap(ctx, start)
    fit_ctx, n = ctx.head(min(FIT_TOKENS, FIT_ELEMENTS // ctx.vocab))
    fit_start = State(scores.rows.take(n), fit_ctx.tokens, fit_ctx.owner)
    fits = _semantic(fit_ctx, fit_start, lim, progress) if g0 > lim else []
    found = _shares(ctx, start, fits, g0)
    state = _applied(ctx, start, fits)
    flips = routing.stats(ctx)
    if flips and flips["tokens_with_flip"] > 0 and "routing" not in {c.name for c in found}:
        state = _replay_share(ctx, state, g0, lim, found)
    g = gap(ctx, state)
    if g > lim:
        found.append(Cause("numeric", g, g / g0, "mean |d logprob| nats",
                           "an engine numeric choice (dtype, kernel, reduction order): fingerprint it with "
                           "aligntools.fingerprint / mlab check --infer, drill with mlab audit --drill",
                           {**remainder(ctx.engine, state.logprobs(), ctx.position),
                            **precision.numeric_detail(ctx, state, progress)}))
    causes = tuple(sorted(found, key=lambda c: -c.share))
    return AuditResult("misaligned" if g0 > lim else "aligned", causes if g0 > lim else (), g0, floor, lim,
                       len(ctx.tokens), len(recs), flips)


def _semantic(ctx: Context, start: State, lim: float, progress: bool = False) -> list[Fit]:
    """Greedy: add the cause that closes the most of the remaining gap while it closes >= ACCEPT of it,
    then refit every cause found with the others applied (an engine at T = 0.7 with top-k 50 fits
    T = 0.63 alone; with top-k applied, T is fitted again and comes out right)."""
    fits: list[Fit] = []
    state, g = start, gap(ctx, start)
    while g > lim:
        tried = {f.name for f in fits}
        untried = [(name, fn) for name, fn in CAUSES.items() if name not in tried]
        bar = tqdm(untried, desc=f"causes, round {len(fits) + 1}", unit="cause", disable=not progress, leave=False)
        candidates = [f for name, fn in bar if (f := fn(ctx, state))]
        if not candidates:
            break
        g_best, best = min(((gap(ctx, f.apply(ctx, state)), f) for f in candidates), key=lambda p: p[0])
        if g_best > ACCEPT * g or g - g_best <= lim:  # closes too little, or no more than the noise allows
            break
        fits = _backfit(ctx, start, [*fits, best])
        state = _applied(ctx, start, fits)
        g = gap(ctx, state)
    return fits


def _replay_share(ctx: Context, state: State, g0: float, lim: float, found: list[Cause]) -> State:
    """Flips that did not close half the gap (a bf16 engine's flips are a symptom of its numerics):
    what replaying them removes is still routing's share, and ``numeric`` keeps the rest."""
    g = gap(ctx, state)
    if g <= lim:
        return state
    replay = CAUSES["routing"](ctx, state)
    replayed = replay.apply(ctx, state)
    g_r = gap(ctx, replayed)
    found.append(_cause(ctx, replay, max(g - g_r, 0.0) / g0))
    return replayed if g_r < g else state


def _backfit(ctx: Context, start: State, fits: list[Fit]) -> list[Fit]:
    """Each fit refitted with the others applied (coordinate descent, ``BACKFIT_PASSES`` passes)."""
    for _ in range(BACKFIT_PASSES if len(fits) > 1 else 0):
        for i, fit in enumerate(fits):
            fits[i] = CAUSES[fit.name](ctx, _applied(ctx, start, fits[:i] + fits[i + 1:])) or fit
    return fits


def _applied(ctx: Context, start: State, fits: list[Fit]) -> State:
    for fit in fits:
        start = fit.apply(ctx, start)
    return start


def _shares(ctx: Context, start: State, fits: list[Fit], g0: float) -> list[Cause]:
    """Each cause's share over all records: the gap it removes, applied in the order found, over the whole gap."""
    causes, before = [], g0
    for i, fit in enumerate(fits):
        after = gap(ctx, _applied(ctx, start, fits[: i + 1]))
        causes.append(_cause(ctx, fit, (before - after) / g0))
        before = after
    return causes


def _cause(ctx: Context, fit: Fit, share: float) -> Cause:
    if fit.name == "routing":  # fitted on the first records: count the flips of all of them
        found = routing.stats(ctx)
        return Cause(fit.name, found["tokens_with_flip"], share, fit.parameter, fit.fix, found)
    return Cause(fit.name, fit.estimate, share, fit.parameter, fit.fix, fit.detail)


def _floor(ctx: Context, model: Model, start: State) -> tuple[float, float]:
    """(floor, limit): the trainer's fp32 logprobs against float64 on the first ``FLOOR_TOKENS`` completion
    tokens of the first ``FLOOR_RECORDS`` records (a causal model scores a prefix as it scores the whole)."""
    recs = ctx.records[:FLOOR_RECORDS]
    lp64 = score(load_model(model, torch.float64), [r.prompt_ids for r in recs],
                 [r.completion_ids[:FLOOR_TOKENS] for r in recs]).rows.lp  # [n] float64
    return limit(start.logprobs()[(ctx.owner < FLOOR_RECORDS) & (ctx.position < FLOOR_TOKENS)], lp64)


def _check_vocab(recs: list[Record], trainer: nn.Module) -> None:
    vocab = trainer.get_output_embeddings().weight.shape[0]
    for i, r in enumerate(recs):
        top = max(max(r.prompt_ids), max(r.completion_ids))
        if top >= vocab:
            raise RecordError(f"record {i}: token id {top} is outside the model's vocabulary of {vocab}; "
                              "audit with the model that produced the records (--model)")


def records_of(paths: Sequence[str | Path]) -> list[Record]:
    """Every record of every file, in order (``mlab audit A.jsonl B.pt``)."""
    return [r for p in paths for r in read(p)]
