"""Per-token summaries of a site tensor: what stats mode keeps instead of the tensor.

Why per token and not per site: a mismatch hunt asks "which token diverged first", and a
7B model's full activations do not fit in memory while 8 numbers per token per site do.
The ``hash`` column makes bit-equality checkable without the tensor: two rows with the
same float32 bytes get the same hash on any machine, in any summation order.
"""

from __future__ import annotations

import torch

STAT_NAMES: tuple[str, ...] = ("min", "max", "mean", "l2", "amax", "n_nan", "n_inf", "hash")

_P1, _P2 = 2_147_483_647, 2_097_143  # primes below 2**31 and 2**21: 31 + 21 = 52 hash bits
_MAX_HALVES = 1 << 21  # per float64 product-sum: 2**21 terms of magnitude < 2**31 stay below 2**53
_weights_cache: dict[tuple[int, int, str], torch.Tensor] = {}


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """Summaries of each row of ``x`` [N, ...] -> float64 [N, len(STAT_NAMES)].

    Values are widened to float32 first (the capture's storage dtype), so a stats capture
    equals the stats of the matching tensor capture. ``min/max/mean/l2/amax`` are over the
    finite entries only (NaN where a row has none); ``n_nan``/``n_inf`` count the rest;
    sums are accumulated in float64. Integer sites (``topk_ids``) are summarised as values.
    """
    rows = x.detach().reshape(x.shape[0], -1)  # [N, D]
    flt = rows.to(torch.float32)
    n = flt.shape[1]
    mn, mx = torch.aminmax(flt, dim=1) if n else (flt.sum(1), flt.sum(1))
    if bool(torch.isfinite(mn).all() and torch.isfinite(mx).all()):  # NaN/inf would show in min or max
        mn, mx = mn.double(), mx.double()
        mean = flt.sum(1, dtype=torch.float64) / n
        l2 = torch.linalg.vector_norm(flt, dim=1, dtype=torch.float64)
        n_nan = n_inf = torch.zeros(len(flt), dtype=torch.float64, device=flt.device)
    else:
        mn, mx, mean, l2, n_nan, n_inf = _masked_stats(flt)
    amax = torch.maximum(mx.abs(), mn.abs())
    store = flt if rows.is_floating_point() else rows.to(torch.int64)
    return torch.stack([mn, mx, mean, l2, amax, n_nan, n_inf, row_hash(store)], dim=1)


def _masked_stats(flt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The slow path for rows holding NaN/inf: summaries over the finite entries."""
    wide = flt.double()
    nan, inf = torch.isnan(wide), torch.isinf(wide)
    finite = ~(nan | inf)
    cnt = finite.sum(1)
    zeroed = torch.where(finite, wide, 0.0)
    none = cnt == 0
    mn = torch.where(none, torch.nan, torch.where(finite, wide, torch.inf).amin(1))
    mx = torch.where(none, torch.nan, torch.where(finite, wide, -torch.inf).amax(1))
    l2 = torch.where(none, torch.nan, torch.linalg.vector_norm(zeroed, dim=1))
    return mn, mx, zeroed.sum(1) / cnt, l2, nan.sum(1).double(), inf.sum(1).double()


def row_hash(rows: torch.Tensor) -> torch.Tensor:
    """52-bit content hash of each row's bytes, as float64 [N] (exactly representable).

    ``rows`` is [N, D] float32 or int64, read as signed 16-bit halves (a free view). Two
    random linear combinations of the halves (weights < 2**16) are computed as float64
    products whose every partial sum is an integer of magnitude below 2**53, hence exact in
    any order (BLAS, GPU, chunking); reduced modulo two primes they give 31 + 21 bits.
    """
    halves = rows.contiguous().view(torch.int16)  # [N, H]
    sums = torch.zeros(len(halves), 2, dtype=torch.int64, device=halves.device)
    for lo in range(0, max(halves.shape[1], 1), _MAX_HALVES):
        chunk = halves[:, lo:lo + _MAX_HALVES].to(torch.float64)
        sums += (chunk @ _weights(chunk.shape[1], lo, chunk.device)).to(torch.int64)
    h1, h2 = sums[:, 0] % _P1, sums[:, 1] % _P2  # torch's % is non-negative for a positive divisor
    return ((h1 << 21) | h2).to(torch.float64)


def _weights(width: int, offset: int, device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random integer weights in [1, 2**16) for columns ``offset..offset+width``."""
    key = (width, offset, str(device))
    if key not in _weights_cache:
        gen = torch.Generator().manual_seed(0x5EED + offset)
        _weights_cache[key] = torch.randint(1, 1 << 16, (width, 2), generator=gen).to(device, torch.float64)
    return _weights_cache[key]
