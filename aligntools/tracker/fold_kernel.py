"""The last step of stats mode's row hash, compiled: each row's lane sums -> its 52-bit hash.

Why compiled: in torch the fold is two products, two sums over 8 lanes and two modulos on
an [rows, 8] int64 table, ~0.5 ms per flush of a 41-site, 512-token capture (a third of
stats mode's finish), nearly all of it the overhead of short reductions; this loop takes
~0.1 ms. The arithmetic is exact integer arithmetic (every term below 2**52, a row's sum
below 2**55), so it gives the torch form's hash on every input (tested against it).
"""

from __future__ import annotations

import numpy as np
import torch

from aligntools.numba_safe import numba

_SHORT = 1 << 31  # a lane of one chunk is below this in magnitude: no reduction needed


@numba.njit(nogil=True, cache=True)
def _fold_rows(lanes, weights, p1, p2, out):
    """``lanes`` [N, L] int32/int64, ``weights`` [2, L] int64 -> ``out`` float64 [N]."""
    for r in range(lanes.shape[0]):
        h1, h2 = 0, 0
        for j in range(lanes.shape[1]):
            v = np.int64(lanes[r, j])
            big = v >= _SHORT or v <= -_SHORT  # several chunks' sum: reduced first, the same residue
            h1 += (v % p1 if big else v) * weights[0, j]
            h2 += (v % p2 if big else v) * weights[1, j]
        out[r] = np.float64(((h1 % p1) << 21) | (h2 % p2))


def fold(lanes: torch.Tensor, weights: torch.Tensor, p1: int, p2: int) -> torch.Tensor:
    """(sum_j lane_j * weights[0, j]) mod p1, shifted over (sum_j lane_j * weights[1, j]) mod
    p2, for each row of ``lanes`` [N, L] (CPU): float64 [N]."""
    out = torch.empty(lanes.shape[0], dtype=torch.float64)
    if lanes.shape[0]:
        _fold_rows(lanes.contiguous().numpy(), weights.to(torch.int64).numpy(), p1, p2, out.numpy())
    return out
