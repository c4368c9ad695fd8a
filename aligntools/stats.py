"""Per-token summaries of a site tensor: what stats mode keeps instead of the tensor.

Why per token and not per site: a mismatch hunt asks "which token diverged first", and a
7B model's full activations do not fit in memory while 8 numbers per token per site do.
The ``hash`` column makes bit-equality checkable without the tensor: two rows with the
same float32 bytes get the same hash on any machine (integer arithmetic only).
"""

from __future__ import annotations

import torch

STAT_NAMES: tuple[str, ...] = ("min", "max", "mean", "l2", "amax", "n_nan", "n_inf", "hash")

# Two Mersenne-ish primes < 2**31: products of two residues stay below 2**62, so a sum
# over up to 2**31 columns never overflows int64 (no reliance on wrap-around).
_P1, _P2 = 2_147_483_647, 2_147_483_629
_HASH_BITS_1, _HASH_BITS_2 = 31, 21  # 52 bits in all: exactly representable in float64
_weights_cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """Summaries of each row of ``x`` [N, ...] -> float64 [N, len(STAT_NAMES)].

    Values are widened to float32 first (the capture's storage dtype), so a stats capture
    equals the stats of the matching tensor capture. ``min/max/mean/l2/amax`` are over the
    finite entries only (NaN where a row has none); ``n_nan``/``n_inf`` count the rest.
    Integer sites (``topk_ids``) are summarised as their values.
    """
    rows = x.detach().reshape(x.shape[0], -1)  # [N, D]
    flt = rows.to(torch.float32)
    wide = flt.to(torch.float64)  # [N, D]
    nan = torch.isnan(wide)
    inf = torch.isinf(wide)
    finite = ~(nan | inf)
    if bool(finite.all()):
        mn, mx = wide.amin(1), wide.amax(1)
        mean = wide.mean(1)
        l2 = torch.linalg.vector_norm(wide, dim=1)
    else:
        mn = torch.where(finite, wide, torch.inf).amin(1)
        mx = torch.where(finite, wide, -torch.inf).amax(1)
        cnt = finite.sum(1)
        zeroed = torch.where(finite, wide, 0.0)
        mean = zeroed.sum(1) / cnt
        l2 = torch.linalg.vector_norm(zeroed, dim=1)
        none = cnt == 0
        mn, mx, l2 = (torch.where(none, torch.nan, t) for t in (mn, mx, l2))
    amax = torch.maximum(mx.abs(), mn.abs())
    store = flt if rows.is_floating_point() else rows.to(torch.int64)
    return torch.stack(
        [mn, mx, mean, l2, amax, nan.sum(1).double(), inf.sum(1).double(), row_hash(store)], dim=1
    )


def row_hash(rows: torch.Tensor) -> torch.Tensor:
    """52-bit content hash of each row's bytes, as float64 [N] (exactly representable).

    ``rows`` is [N, D] float32 or int64; the bytes are read as 32-bit words, each word's
    residue is weighted by a fixed pseudo-random per-column weight and summed modulo two
    primes. Deterministic across devices and summation orders (pure integer math).
    """
    words = rows.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [N, W] in [0, 2^32)
    w1, w2 = _weights(words.shape[1], words.device)
    h1 = ((words % _P1) * w1 % _P1).sum(1) % _P1
    h2 = ((words % _P2) * w2 % _P2).sum(1) % _P2
    h = (h1 << _HASH_BITS_2) | (h2 & ((1 << _HASH_BITS_2) - 1))
    return h.to(torch.float64)


def _weights(width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (width, str(device))
    if key not in _weights_cache:
        gen = torch.Generator().manual_seed(0x5EED)
        w1 = torch.randint(1, _P1, (width,), generator=gen, dtype=torch.int64)
        w2 = torch.randint(1, _P2, (width,), generator=gen, dtype=torch.int64)
        _weights_cache[key] = (w1.to(device), w2.to(device))
    return _weights_cache[key]
