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

from collections.abc import Callable

import torch

from aligntools.audit.fit import fit_1d, sorted_probs, truncation_fit
from aligntools.audit.registry import Fit, register_cause
from aligntools.audit.state import Context, Processor, State, gap

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
    def tempered(t: float) -> Callable[[Context, State], State]:
        return lambda c, s: s.with_processor("temperature", lambda z, rows: z / t)

    t, _ = fit_1d(lambda t: gap(ctx, tempered(t)(ctx, state)), *TEMPERATURE_RANGE, log=True)
    return Fit("temperature", t, "T", tempered(t), _side(ctx, "temperature", t))


def _truncation(ctx: Context, state: State, stage: str, grid: torch.Tensor, kept: type) -> tuple[float, float]:
    """Fit a truncation stage on the distribution the stages before it leave. Candidates: ``grid`` plus
    each token's own boundary values (``kept.per_token``), so the planted value's kept sets are among
    them; ``kept.count`` gives the tokens kept per position for each candidate."""
    z = state.processed(until=stage)  # [N, V]
    lp = torch.log_softmax(z, -1).gather(-1, ctx.tokens[:, None])[:, 0]  # [N]
    s, cum, rank = sorted_probs(z, ctx.tokens)
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


def _penalised(ctx: Context, kind: str, value: float) -> Processor:
    if kind == "repetition_penalty":
        return lambda z, rows: torch.where(ctx.seen(rows), torch.where(z > 0, z / value, z * value), z)
    if kind == "presence_penalty":
        return lambda z, rows: z - value * (ctx.counts(rows) > 0)
    return lambda z, rows: z - value * ctx.counts(rows)


@register_cause("penalty")
def penalty(ctx: Context, state: State) -> Fit | None:
    """Repetition, presence or frequency penalty: each kind fitted in 1-D, the best kept."""
    best = None
    for kind, (lo, hi) in PENALTY_RANGES.items():
        value, loss = fit_1d(lambda v: gap(ctx, state.with_processor("penalty", _penalised(ctx, kind, v))), lo, hi,
                             log=kind == "repetition_penalty")
        if best is None or loss < best[2]:
            best = (kind, value, loss)
    kind, value, _ = best
    return Fit("penalty", value, kind, lambda c, s: s.with_processor("penalty", _penalised(c, kind, value)),
               _side(ctx, kind, value))
