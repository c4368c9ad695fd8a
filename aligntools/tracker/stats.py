"""Per-token summaries of a site tensor: what stats mode keeps instead of the tensor.

Why per token and not per site: a mismatch hunt asks "which token diverged first", and a
7B model's full activations do not fit in memory while 8 numbers per token per site do.
The ``hash`` column makes bit-equality checkable without the tensor: two rows with the
same float32 bytes get the same hash on any machine, in any summation order.

Why it is written the way it is: stats mode runs on every site of every forward, so its
cost is the Tracker's overhead. Each stat is one vectorised pass over the captured tensor
with no float64 copy of it: min/max in float32 (exact), the two float64 sums
in cache-sized row blocks, the hash as an exact int8 matrix product.
"""

from __future__ import annotations

import torch

STAT_NAMES: tuple[str, ...] = ("min", "max", "mean", "l2", "amax", "n_nan", "n_inf", "hash")

_BLOCK = 1 << 18  # elements per float64-summed block on CPU (a 2 MiB temporary)
_LANES = 8  # int32 lane sums per row folded into the hash
_CHUNK = 1 << 17  # bytes per product: 2**17 terms of |byte * weight| <= 128 * 127 stay below 2**31
_P1, _P2 = 2_147_483_647, 2_097_143  # primes below 2**31 and 2**21: 31 + 21 = 52 hash bits
_weights_cache: dict[tuple[int, int, str], torch.Tensor] = {}
_FOLD = torch.randint(1, _P2, (2, _LANES), generator=torch.Generator().manual_seed(0xF01D))  # [2, lanes]


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """Summaries of each row of ``x`` [N, ...] -> float64 [N, len(STAT_NAMES)].

    Values are widened to float32 (the capture's storage dtype), so a stats capture equals
    the stats of the matching tensor capture. ``min/max/mean/l2/amax`` are over the finite
    entries only (NaN where a row has none); ``n_nan``/``n_inf`` count the rest; sums are
    accumulated in float64 (relative error ~1e-16 * sqrt(D)). Integer sites (``topk_ids``)
    are summarised as values and hashed as int64.
    """
    rows = x.detach().reshape(x.shape[0], -1)  # [N, D]
    flt = rows.to(torch.float32)  # no copy for float32
    n = flt.shape[1]
    # separate amin/amax: torch.aminmax is ~50x slower on CPU; both propagate NaN, so NaN/inf show here
    mn, mx = (flt.amin(1).double(), flt.amax(1).double()) if n else (flt.sum(1).double(),) * 2  # [N] each
    if bool(torch.isfinite(mn).all() and torch.isfinite(mx).all()):
        total, l2 = _sum_l2(flt)
        mean = total / n
        n_nan = n_inf = torch.zeros(len(flt), dtype=torch.float64, device=flt.device)
    else:
        mn, mx, mean, l2, n_nan, n_inf = _masked_stats(flt)
    amax = torch.maximum(mx.abs(), mn.abs())
    store = flt if rows.is_floating_point() else rows.to(torch.int64)
    return torch.stack([mn, mx, mean, l2, amax, n_nan, n_inf, row_hash(store)], dim=1)


def _sum_l2(flt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, l2 norm) of each row of float32 ``flt`` [N, D], accumulated in float64.

    On CPU in row blocks of about ``_BLOCK`` elements: torch widens to a float64 temporary,
    and one of 32 MiB or more is a fresh mmap that page-faults on every call (6-15x slower).
    Other devices reduce the tensor in one go.
    """
    per = max(1, _BLOCK // max(flt.shape[1], 1)) if flt.device.type == "cpu" else max(len(flt), 1)
    blocks = flt.split(per)  # views, [<=per, D] each
    return (torch.cat([b.sum(1, dtype=torch.float64) for b in blocks]),
            torch.cat([torch.linalg.vector_norm(b, dim=1, dtype=torch.float64) for b in blocks]))


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

    ``rows`` [N, D] (float32 or int64) is read as signed bytes (a free view) and multiplied
    by a fixed pseudo-random int8 matrix [bytes, 8] with no zero entry: 8 exact integer
    lane sums per row (|sum| < 2**31 per 2**17-byte chunk, so every device and summation
    order gives the same integers; a change of one byte always changes every lane). The
    lanes are folded into two random linear combinations modulo the primes below 2**31
    and 2**21 (31 + 21 bits): rows that differ collide with probability ~2**-52.
    """
    data = rows.contiguous().view(torch.int8)  # [N, B]
    lanes = torch.zeros(len(data), _LANES, dtype=torch.int64, device=data.device)
    for lo in range(0, data.shape[1], _CHUNK):
        chunk = data[:, lo:lo + _CHUNK]
        lanes += _int8_matmul(chunk, _weights(chunk.shape[1], lo, chunk.device))
    fold = _FOLD.to(lanes.device)
    h1 = ((lanes % _P1) * fold[0]).sum(1) % _P1  # terms < 2**52: no int64 overflow
    h2 = ((lanes % _P2) * fold[1]).sum(1) % _P2
    return ((h1 << 21) | h2).to(torch.float64)


def _int8_matmul(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a`` [N, K] int8 @ ``w`` [K, L] int8 -> int64 [N, L], exact for the chunk bound.

    CPU has an int8 GEMM with int32 accumulation (``torch._int_mm``); other devices get
    the same integers from a float64 product (every partial sum is an integer < 2**53).
    """
    if a.device.type == "cpu":
        return torch._int_mm(a, w).to(torch.int64)
    return (a.to(torch.float64) @ w.to(torch.float64)).to(torch.int64)


def _weights(width: int, offset: int, device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random int8 weights in ±[1, 127] for the bytes ``offset..offset+width``."""
    key = (width, offset, str(device))
    if key not in _weights_cache:
        gen = torch.Generator().manual_seed(0x5EED + offset)
        mag = torch.randint(1, 128, (width, _LANES), generator=gen)
        sign = torch.randint(0, 2, (width, _LANES), generator=gen) * 2 - 1
        _weights_cache[key] = (mag * sign).to(device, torch.int8)
    return _weights_cache[key]
