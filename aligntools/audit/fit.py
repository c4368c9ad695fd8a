"""Fitting a cause's parameter to the recorded logprobs.

Two shapes of fit. A continuous parameter (T, a penalty) is a 1-D minimisation of the gap: a grid
finds the basin, golden-section search narrows it to ``FIT_RTOL``. A truncation (top-k, top-p,
min-p) keeps a set of tokens and renormalises over it, so the engine's logprob is the model's minus
log S, S the kept mass: for every candidate parameter, the kept count per token gives S exactly, and
the loss over all candidates is one gather.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

FIT_RTOL = 1e-4
"""Relative width at which the 1-D search stops: estimates are good to this fraction."""
GRID = 17
"""Grid points that find the basin (log-spaced over T in [0.05, 20]: neighbours 1.45x apart)."""
CHUNK_ELEMENTS = 1 << 23
"""Positions x candidates evaluated per gather in a truncation fit: bounds memory at 64 MB, and few large
gathers beat ~200 small ones (a top-k fit on a 49k vocabulary has 49k candidates)."""
GOLDEN = (math.sqrt(5) - 1) / 2


def fit_1d(loss: Callable[[float], float], lo: float, hi: float, log: bool = False) -> tuple[float, float]:
    """(argmin, min) of ``loss`` on [lo, hi] (on a log scale with ``log``), to ``FIT_RTOL``."""
    to_x = math.exp if log else float
    grid = torch.linspace(math.log(lo) if log else lo, math.log(hi) if log else hi, GRID).tolist()
    values = [loss(to_x(u)) for u in grid]
    best = min(range(GRID), key=values.__getitem__)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, GRID - 1)]
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = loss(to_x(c)), loss(to_x(d))
    while abs(to_x(b) - to_x(a)) > FIT_RTOL * abs(to_x((a + b) / 2)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = loss(to_x(c))
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = loss(to_x(d))
    x = to_x((a + b) / 2)
    return min([(x, loss(x)), (to_x(grid[best]), values[best])], key=lambda p: p[1])


def sorted_probs(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of float64 ``logits`` [N, V]: probabilities sorted descending [N, V], their cumulative sums
    [N, V] and the rank of each token [N] (0 = most probable)."""
    probs = logits.softmax(-1)
    s, order = probs.sort(-1, descending=True)
    rank = (order == tokens[:, None]).float().argmax(-1)
    return s, s.cumsum(-1), rank


def truncation_fit(d: torch.Tensor, cum: torch.Tensor, rank: torch.Tensor, candidates: torch.Tensor,
                   kept: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, float]:
    """Best truncation parameter among ``candidates`` [G] and its gap.

    ``d`` [N]: engine minus model logprob; ``cum`` [N, V] sorted cumulative probabilities; ``rank``
    [N]; ``kept(c)`` [N, g]: tokens kept per position for candidate values ``c`` [g]. The engine's
    renormalised logprob is the model's minus log S, S = cum[kept - 1]; a candidate that would have
    dropped a sampled token cannot have produced the record and is ruled out. The estimate is the
    midpoint of the candidates that tie at the minimum (a truncation is identified up to the gaps
    between tokens' cumulative masses).
    """
    losses = []
    for chunk in candidates.split(max(1, CHUNK_ELEMENTS // len(d))):
        n = kept(chunk).clamp(1, cum.shape[1])  # [N, g]
        s = cum.gather(1, n - 1)  # [N, g]
        loss = (d[:, None] + s.log()).abs().mean(0)  # [g]
        losses.append(torch.where((rank[:, None] < n).all(0), loss, torch.inf))
    loss = torch.cat(losses)
    best = float(loss.min())
    if not math.isfinite(best):
        return math.nan, math.inf
    tied = candidates[loss <= best * (1 + 1e-9) + 1e-15]
    return float((tied.min() + tied.max()) / 2), best
