"""Semantic causes in the sampler: temperature, top-k, top-p, min-p and penalties applied to the
engine's logprobs but not to the trainer's.

Signatures (z: the trainer's logits at a position, y: the recorded token):
- temperature: engine logprob = log_softmax(z / T)[y], T fitted in 1-D;
- top_k / top_p / min_p: engine logprob = log_softmax(z)[y] - log S, S the mass of the kept set
  (the k most probable; the smallest prefix of the sorted distribution reaching p; every token with
  p_i >= min_p * p_max);
- penalty: the logits of tokens already seen are changed before sampling (repetition: z / r if z > 0
  else z * r, over prompt and completion; presence: z - a if seen in the completion; frequency:
  z - f * count), one parameter fitted in 1-D per kind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from aligntools.audit.fit import fit_1d, sorted_probs, truncation_fit
from aligntools.audit.registry import Fit, register_cause
from aligntools.audit.logits import token_logprob
from aligntools.audit.state import STAGES, Context, Processor, State, gap, gap_of

TEMPERATURE_RANGE = (0.05, 20.0)
P_GRID = torch.linspace(0.002, 0.998, 499, dtype=torch.float64)
MIN_P_GRID = torch.logspace(-4, 0, 400, dtype=torch.float64)[:-1]
PENALTY_RANGES = {"repetition_penalty": (0.25, 4.0), "presence_penalty": (-3.0, 3.0), "frequency_penalty": (-3.0, 3.0)}


def _side(ctx: Context, key: str, value: float) -> str:
    """Which side to fix: the records' own sampling settings and logprobs_mode say whether the engine was told to."""
    told = {r.sampling.get(key) for r in ctx.records} - {None}
    raw = any(r.logprobs_mode == "raw" for r in ctx.records)
    if raw:
        return (f"the records say logprobs_mode=raw, yet their logprobs carry {key}~{value:.4g}: the engine returned "
                "processed logprobs; check its logprobs mode (vLLM logprobs_mode='raw_logprobs')")
    if told:
        return (f"the engine sampled with {key}={', '.join(f'{v:g}' for v in sorted(told))} and returned processed "
                f"logprobs: score the trainer with the same {key}, or ask the engine for raw logprobs "
                "(vLLM logprobs_mode='raw_logprobs')")
    return (f"the engine applied {key}~{value:.4g}, which the records' sampling settings do not state: pass the "
            f"rollout's {key} to the trainer's logprob computation (or return raw logprobs from the engine)")


@register_cause("temperature")
def temperature(ctx: Context, state: State) -> Fit | None:
    """Engine logprobs are log_softmax(z / T): fit T on a log scale."""
    t, _ = fit_1d(_tempered_loss(ctx, state), *TEMPERATURE_RANGE, log=True)
    fn: Processor = lambda z, rows: z / t  # noqa: E731 - one object per fit: states that apply it share their logprobs
    return Fit("temperature", t, "T", lambda c, s: s.with_processor("temperature", fn), _side(ctx, "temperature", t))


def _tempered_loss(ctx: Context, state: State) -> Callable[[float], float]:
    """T -> the gap with temperature T. The logits before temperature are computed once; with no truncation
    after it, lp = (z_y - m) / T - log sum exp((z - m) / T) is one exp pass over fp32 differences, summed in
    fp32 (a fit needs the argmin to ``FIT_RTOL``, not the loss to float64: fp32 moves lp by ~1e-6 nats)."""
    z = state.processed(until="temperature")  # [n, V] float64
    later = [s for s, _ in state.processors if STAGES.index(s) > STAGES.index("temperature")]
    if later:
        return lambda t: gap_of(ctx, state, token_logprob(state.apply(z / t, slice(None), *later), ctx.tokens))
    d = (z - z.max(-1, keepdim=True).values).float()  # [n, V] <= 0
    dy = d.gather(-1, ctx.tokens[:, None])[:, 0].double()  # [n]
    return lambda t: gap_of(ctx, state, dy / t - d.mul(1 / t).exp_().sum(-1).double().log())


def _truncation(ctx: Context, state: State, stage: str, grid: torch.Tensor, kept: type) -> tuple[float, float]:
    """Fit a truncation stage on the distribution the stages before it leave. Candidates: ``grid`` plus
    each token's own boundary values (``kept.per_token``), so the planted value's kept sets are among
    them; ``kept.count`` gives the tokens kept per position for each candidate."""
    before = tuple(p for p in state.processors if STAGES.index(p[0]) < STAGES.index(stage))
    key = (state.logits, before)  # top-k, top-p and min-p on an untruncated state sort the same rows
    if ctx.cache.get("sorted", (None,))[0] != key:  # one sort held at a time: [N, V] float64 twice
        z = state.processed(until=stage)  # [N, V]
        ctx.cache["sorted"] = key, (token_logprob(z, ctx.tokens), *sorted_probs(z, ctx.tokens))
    lp, s, cum, rank = ctx.cache["sorted"][1]
    d = ctx.engine - lp  # [N]: -log S where a truncation is at work
    own = (cum - (-d).exp()[:, None]).abs().argmin(-1)  # [N]: the kept count each token's gap implies - 1
    candidates = torch.cat([grid, kept.per_token(s, cum, own)]).unique()
    return truncation_fit(d, cum, rank, candidates, lambda c: kept.count(s, cum, c))


class _TopK:
    """Rule of top-k: s, cum [N, V] sorted probabilities and their cumulative sums; own [N] the last
    kept index each token's gap implies; count -> [N, g] kept tokens for candidates [g]."""

    @staticmethod
    def count(s, cum, k):  # [N, g]
        return k.long()[None, :].expand(s.shape[0], -1)

    @staticmethod
    def per_token(s, cum, own):
        return (own + 1).double()


class _TopP:
    """Rule of top-p (arguments as ``_TopK``)."""

    @staticmethod
    def count(s, cum, p):  # first index whose cumulative mass reaches p, + 1
        return torch.searchsorted(cum, p[None, :].expand(cum.shape[0], -1).contiguous()) + 1

    @staticmethod
    def per_token(s, cum, own):  # both ends of each token's interval (mass before its last kept token, up to it]
        upper = cum.gather(1, own[:, None])[:, 0]
        return torch.cat([upper, torch.nextafter(upper - s.gather(1, own[:, None])[:, 0], torch.ones(()).double())])


class _MinP:
    """Rule of min-p (arguments as ``_TopK``)."""

    @staticmethod
    def count(s, cum, m):  # tokens with p_i >= m * p_max
        ratio = (s / s[:, :1]).flip(-1).contiguous()  # [N, V] ascending
        return s.shape[1] - torch.searchsorted(ratio, m[None, :].expand(s.shape[0], -1).contiguous())

    @staticmethod
    def per_token(s, cum, own):  # both ends: the last kept ratio, and just above the first dropped one
        ratio = s / s[:, :1]
        dropped = ratio.gather(1, (own[:, None] + 1).clamp(max=s.shape[1] - 1))[:, 0]
        return torch.cat([ratio.gather(1, own[:, None])[:, 0], torch.nextafter(dropped, torch.ones(()).double())])


@register_cause("top_k")
def top_k(ctx: Context, state: State) -> Fit | None:
    """Kept set: the k most probable tokens (ties at the k-th kept, as HF and vLLM do)."""
    k, _ = _truncation(ctx, state, "top_k", torch.arange(1, ctx.vocab, dtype=torch.float64), _TopK)
    if k != k:  # NaN: no k keeps every sampled token
        return None
    k = int(round(k))

    def keep(z: torch.Tensor, rows: slice) -> torch.Tensor:
        kth = z.topk(k, -1).values[:, -1:]
        return z.masked_fill(z < kth, -torch.inf)

    return Fit("top_k", k, "k", lambda c, s: s.with_processor("top_k", keep), _side(ctx, "top_k", k))


@register_cause("top_p")
def top_p(ctx: Context, state: State) -> Fit | None:
    """Kept set: the most probable tokens until their mass reaches p (a token is kept while the mass
    before it is below p)."""
    p, _ = _truncation(ctx, state, "top_p", P_GRID, _TopP)
    if p != p:
        return None

    def keep(z: torch.Tensor, rows: slice) -> torch.Tensor:
        s, order = z.softmax(-1).sort(-1, descending=True)
        drop = (s.cumsum(-1) - s) >= p  # [N, V] in sorted order
        return z.masked_fill(drop.scatter(-1, order, drop), -torch.inf)

    return Fit("top_p", p, "p", lambda c, s: s.with_processor("top_p", keep), _side(ctx, "top_p", p))


@register_cause("min_p")
def min_p(ctx: Context, state: State) -> Fit | None:
    """Kept set: tokens at least min_p times as probable as the most probable one."""
    m, _ = _truncation(ctx, state, "min_p", MIN_P_GRID, _MinP)
    if m != m:
        return None

    def keep(z: torch.Tensor, rows: slice) -> torch.Tensor:
        probs = z.softmax(-1)
        return z.masked_fill(probs < m * probs.max(-1, keepdim=True).values, -torch.inf)

    return Fit("min_p", m, "min_p", lambda c, s: s.with_processor("min_p", keep), _side(ctx, "min_p", m))


def _penalty(z: torch.Tensor, count: torch.Tensor, kind: str, value: float) -> torch.Tensor:
    """Logits ``z`` after a penalty of ``kind``; ``count`` (as ``z``): how often each token was seen (> 0: seen)."""
    if kind == "repetition_penalty":
        return torch.where(count > 0, torch.where(z > 0, z / value, z * value), z)
    if kind == "presence_penalty":
        return z - value * (count > 0)
    return z - value * count


def _penalised(ctx: Context, kind: str, value: float) -> Processor:
    """The dense processor, one object per (context, kind, value): states that apply it share their logprobs."""
    def fn(z: torch.Tensor, rows: slice) -> torch.Tensor:
        count = ctx.seen(rows).double() if kind == "repetition_penalty" else ctx.counts(rows)  # [n, V]
        return _penalty(z, count, kind, value)

    return ctx.cache.setdefault(("penalty", kind, value), fn)


def _penalty_loss(ctx: Context, state: State, kind: str) -> Callable[[float], float]:
    """value -> the gap with that penalty. A penalty changes only the seen tokens' logits ([n, S], S the
    longest history), so with nothing but elementwise stages after it (temperature) the unseen tokens'
    log-mass is computed once and each value costs O(n S), not O(n V); otherwise the dense processor."""
    later = [s for s, _ in state.processors if s != "penalty"]
    if set(later) - {"temperature"}:
        return lambda v: gap(ctx, state.with_processor("penalty", _penalised(ctx, kind, v)))
    z = state.processed(until="penalty")  # [n, V] float64
    ids, count = _padded(ctx.history(slice(None), prompt=kind == "repetition_penalty"))  # [n, S], [n, S]
    full = state.apply(z, slice(None), *later)  # [n, V]
    seen = torch.zeros_like(z).scatter_add_(1, ids, (count > 0).double()) > 0  # [n, V]
    rest = full.masked_fill(seen, -torch.inf).logsumexp(-1)  # [n]: log-mass of the unseen tokens
    zs = z.gather(1, ids)  # [n, S]
    at_y = (ids == ctx.tokens[:, None]) & (count > 0)  # [n, S]: the recorded token among the seen
    zy = full.gather(1, ctx.tokens[:, None])[:, 0]  # [n]: its value when unseen

    def loss(value: float) -> float:
        p = state.apply(_penalty(zs, count, kind, value), slice(None), *later).masked_fill(count == 0, -torch.inf)
        y = torch.where(at_y.any(-1), p.masked_fill(~at_y, -torch.inf).amax(-1), zy)  # [n]
        return gap_of(ctx, state, y - torch.logaddexp(rest, p.logsumexp(-1)))

    return loss


def _padded(history: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the distinct ids of ``history`` and their counts, padded: ([n, S] long, [n, S] float64, 0 = padding)."""
    rows = [Counter(h) for h in history]
    width = max([1, *map(len, rows)])
    ids, count = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.float64)
    for n, c in enumerate(rows):
        ids[n, : len(c)] = torch.tensor(list(c.keys()), dtype=torch.long)
        count[n, : len(c)] = torch.tensor(list(c.values()), dtype=torch.float64)
    return ids, count


@register_cause("penalty")
def penalty(ctx: Context, state: State) -> Fit | None:
    """Repetition, presence or frequency penalty: each kind fitted in 1-D, the best kept."""
    best = None
    for kind, (lo, hi) in PENALTY_RANGES.items():
        value, loss = fit_1d(_penalty_loss(ctx, state, kind), lo, hi, log=kind == "repetition_penalty")
        if best is None or loss < best[2]:
            best = (kind, value, loss)
    kind, value, _ = best
    return Fit("penalty", value, kind, lambda c, s: s.with_processor("penalty", _penalised(c, kind, value)),
               _side(ctx, kind, value))
