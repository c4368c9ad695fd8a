"""Each cause's processor against a plain float64 reference written from its definition, and each fit
recovering a parameter from logprobs that reference made."""

from __future__ import annotations

import math

import pytest
import torch

from aligntools.audit import CAUSES
from aligntools.audit.fit import FIT_RTOL
from aligntools.audit.state import Context, State, gap
from aligntools.records import Record

N, V = 40, 64


def _reference(row: list[float], token: int, kind: str, value: float) -> float:
    """The engine's logprob of ``token`` by definition, one position, in Python floats."""
    if kind == "temperature":
        row = [z / value for z in row]
    m = max(row)
    probs = [math.exp(z - m) for z in row]
    total = sum(probs)
    probs = [p / total for p in probs]
    order = sorted(range(len(row)), key=lambda i: -probs[i])
    if kind == "top_k":
        kept = set(order[: int(value)])
    elif kind == "top_p":
        kept, mass = set(), 0.0
        for i in order:
            if mass >= value:
                break
            kept.add(i)
            mass += probs[i]
    elif kind == "min_p":
        kept = {i for i in order if probs[i] >= value * probs[order[0]]}
    else:
        kept = set(order)
    if token not in kept:
        return -math.inf
    return math.log(probs[token]) - math.log(sum(probs[i] for i in kept))


@pytest.mark.parametrize("kind,value", [("temperature", 0.7), ("top_k", 9), ("top_p", 0.83), ("min_p", 0.2)])
def test_fit_recovers_the_reference_parameter(kind, value):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, V, generator=g, dtype=torch.float64) * 3  # [N, V]
    probs = logits.softmax(-1)
    if kind == "temperature":
        tokens = torch.multinomial((logits / value).softmax(-1), 1, generator=g)[:, 0]
    else:  # sample among the tokens the truncation keeps: the reference logprob is finite
        finite = torch.tensor([[math.isfinite(_reference(logits[n].tolist(), t, kind, value)) for t in range(V)]
                               for n in range(N)])
        tokens = torch.multinomial(probs * finite, 1, generator=g)[:, 0]
    engine = [_reference(logits[n].tolist(), int(tokens[n]), kind, value) for n in range(N)]
    record = Record((1,), tuple(tokens.tolist()), tuple(engine))
    ctx = Context.of([record], model=None, vocab=V)
    fit = CAUSES[kind](ctx, State(logits.float(), ctx.tokens, ctx.owner))
    assert fit.name == kind
    # fp32 logits: the fitted processor reproduces the float64 reference to fp32 rounding of |logprob|
    scale = float(ctx.engine.abs().max()) * torch.finfo(torch.float32).eps * V
    assert gap(ctx, fit.apply(ctx, State(logits.float(), ctx.tokens, ctx.owner))) <= scale
    if kind == "temperature":
        assert abs(fit.estimate / value - 1) <= 2 * FIT_RTOL
    elif kind == "top_k":
        assert fit.estimate == value
    else:
        assert _same_kept_sets(probs, kind, fit.estimate, value)


def _same_kept_sets(probs: torch.Tensor, kind: str, a: float, b: float) -> bool:
    """Whether parameters ``a`` and ``b`` keep the same tokens at every position."""
    s = probs.sort(-1, descending=True).values
    if kind == "top_p":
        count = lambda p: ((s.cumsum(-1) - s) < p).sum(-1)  # noqa: E731
    else:
        count = lambda m: (s >= m * s[:, :1]).sum(-1)  # noqa: E731
    return bool((count(a) == count(b)).all())


def _penalised(row: list[float], kind: str, value: float, prompt: list[int], before: list[int]) -> list[float]:
    """One position's logits after a penalty, by definition: repetition over prompt + earlier completion
    tokens, presence and frequency over the earlier completion tokens."""
    if kind == "repetition_penalty":
        seen = set(prompt) | set(before)
        return [(z / value if z > 0 else z * value) if i in seen else z for i, z in enumerate(row)]
    if kind == "presence_penalty":
        return [z - value * (i in before) for i, z in enumerate(row)]
    return [z - value * before.count(i) for i, z in enumerate(row)]


@pytest.mark.parametrize("kind,value", [("repetition_penalty", 1.4), ("presence_penalty", 0.8),
                                        ("frequency_penalty", 0.5)])
def test_penalty_fit_names_the_kind_and_value(kind, value):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(N, V, generator=g, dtype=torch.float64) * 2  # [N, V]
    prompt = [3, 4, 5]
    tokens = torch.randint(0, 12, (N,), generator=g).tolist()  # few distinct ids: many repeats
    engine = []
    for t in range(N):
        z = _penalised(logits[t].tolist(), kind, value, prompt, tokens[:t])
        engine.append(z[tokens[t]] - math.log(sum(math.exp(x) for x in z)))
    ctx = Context.of([Record(tuple(prompt), tuple(tokens), tuple(engine))], model=None, vocab=V)
    fit = CAUSES["penalty"](ctx, State(logits.float(), ctx.tokens, ctx.owner))
    assert fit.parameter == kind
    assert abs(fit.estimate / value - 1) <= 2 * FIT_RTOL
