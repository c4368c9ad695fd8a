"""The fingerprint by size: which precision choices make a gap as large as the recorded one.

Why: the token-by-token fingerprint (``precision.shares``) names a precision choice only when the engine
rounds as the re-scored candidate does. A bf16 engine on a real model rounds in its own order (its kernels,
its fused ops), and after a few dozen layers its rounding errors are independent of a bf16 re-score's: on
smollm2-135m and gemma3-270m no candidate removes any of a minirl bf16 engine's gap, and the per-token
deltas have a cosine below 0.25 (docs/audit.md). What independent realisations of one precision choice
share is their size. So each candidate's own gap against the trainer is set beside the recorded one: a
candidate whose gap is as large (the ratio's 95 % interval holds 1) is consistent with the engine; one whose
gap is smaller cannot be all of it (independent roundings add, they do not cancel on average); one whose gap
is larger overshoots.

The interval is a bootstrap over blocks of ``BLOCK`` consecutive tokens of one record: a token's error
carries into the next ones (the same prefix), so single tokens would make the interval too narrow.
"""

from __future__ import annotations

import numpy as np
import torch

REPRODUCES = 0.2
"""The share of the gap a candidate must remove token by token to be named as what the engine computes;
below it the by-size reading speaks (a bf16 re-score of smollm2 removes 0-17 % of a bf16 engine's gap by
chance, and exactly reproduced roundings remove 80-100 %: docs/audit.md)."""
BLOCK = 16
"""Consecutive completion tokens of one record resampled together."""
RESAMPLES = 2000
LEVEL = 0.95


def by_size(engine: torch.Tensor, candidates: dict[str, torch.Tensor], owner: torch.Tensor,
            position: torch.Tensor, seed: int = 0) -> dict:
    """``engine`` [N] and each candidate's [N]: logprob minus the trainer's on the same tokens; ``owner`` and
    ``position`` [N]: each token's record and place in its completion. Returns ``recorded`` (mean |engine|),
    ``unit`` and ``candidates``: per candidate ``gap`` (its mean |delta|), ``ratio`` (recorded / gap) with its
    ``low``/``high`` interval and the ``reading`` ("consistent", "too small", "too large", or "not finite"
    where the candidate overflowed), consistent ones first, then by |log ratio|."""
    unit = owner.long() * (int(position.max()) // BLOCK + 1) + position.long() // BLOCK
    _, unit = torch.unique(unit, return_inverse=True)  # [N] block index 0..B-1
    blocks = int(unit.max()) + 1

    def sums(x: torch.Tensor) -> np.ndarray:  # [B]: sum of |x| per block
        return torch.zeros(blocks, dtype=torch.float64).index_add_(0, unit, x.double().abs()).numpy()

    draws = np.random.default_rng(seed).multinomial(blocks, np.full(blocks, 1.0 / blocks), size=RESAMPLES)  # [R, B]
    recorded = sums(engine)
    out = []
    for name, delta in candidates.items():
        if not bool(torch.isfinite(delta).all()):
            out.append({"candidate": name, "gap": float("nan"), "ratio": float("nan"), "low": float("nan"),
                        "high": float("nan"), "reading": "not finite"})
            continue
        own = sums(delta)
        with np.errstate(divide="ignore", invalid="ignore"):
            boot = (draws @ recorded) / (draws @ own)  # [R]
        low, high = np.nanquantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        ratio = recorded.sum() / own.sum() if own.sum() > 0 else float("inf")
        reading = "too small" if low > 1 else "too large" if high < 1 else "consistent"
        out.append({"candidate": name, "gap": float(own.sum() / len(delta)), "ratio": float(ratio),
                    "low": float(low), "high": float(high), "reading": reading})
    order = {"consistent": 0, "too small": 1, "too large": 1, "not finite": 2}
    distance = lambda r: abs(np.log(r)) if np.isfinite(r) and r > 0 else np.inf  # noqa: E731 - from a ratio of 1
    out.sort(key=lambda c: (order[c["reading"]], distance(c["ratio"])))
    return {"recorded": float(recorded.sum() / len(engine)), "unit": f"blocks of {BLOCK} tokens, {blocks} blocks",
            "candidates": out}


def sentence(found: dict) -> str:
    """The by-size reading as one clause: the consistent candidates, then those too small to be all of it and
    those that overflow (or, when none is consistent, those it is larger and smaller than)."""
    cands = found["candidates"]
    named = lambda reading: [c for c in cands if c["reading"] == reading]  # noqa: E731
    fits, small = named("consistent"), named("too small")
    if not fits:
        larger, smaller = [c["candidate"] for c in small], [c["candidate"] for c in named("too large")]
        return (f"no candidate's gap matches the recorded {found['recorded']:.3g} nats"
                + (f"; it is larger than that of {', '.join(larger)}" if larger else "")
                + (f"; it is smaller than that of {', '.join(smaller)}" if smaller else ""))
    best = fits[0]
    head = (f"by size the gap matches {best['candidate']} ({best['gap']:.3g} nats against {found['recorded']:.3g} "
            f"recorded, ratio {best['ratio']:.2f} [{best['low']:.2f}, {best['high']:.2f}])")
    if len(fits) > 1:
        head += " and " + ", ".join(c["candidate"] for c in fits[1:])
    if small:
        head += f"; too small to be all of it: {', '.join(c['candidate'] for c in small)}"
    overflows = [c["candidate"] for c in named("not finite")]
    if overflows:
        head += f"; {', '.join(overflows)} overflow{'s' if len(overflows) == 1 else ''} on this model"
    return head
