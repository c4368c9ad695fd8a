"""Stats mode's row hash: a 52-bit content hash of each row's bytes, two NH sums wide.

Why a hash at all: a stats capture keeps 8 numbers per token instead of the row, and the
question "is this row bit-identical to the other engine's?" needs one of them to answer it.
Equal bytes must give equal hashes on any device and in any summation order, and rows that
differ (by one ulp, one sign bit, or everywhere) must collide with negligible probability.

Why NH (Black, Halevi, Krawczyk, Krovetz, Rogaway, "UMAC: Fast and Secure Message
Authentication", CRYPTO 1999, section 3.1): it costs one 32 x 32 -> 64-bit multiply per
*two* words, all of it modulo 2**64, so any order of the sum gives the same integer and the
compiled loop runs at the speed of the cache (~35 GB/s on one core here, against ~15 GB/s for
the int8 GEMM that hashed rows before, on two). NH is 2**-32-almost-universal for messages of
one length; two NH sums with independent keys collide with probability 2**-64, and keeping
31 + 21 bits of them (the residues modulo two primes) makes it ~2**-52.

The definition (every path computes exactly this; ``tests`` re-derive it with Python ints):

- the row's bytes are read as W little-endian uint32 words ``m`` (float32: one per value,
  int64: two), and paired as (m[i], m[i + h]) for i < h = floor(W / 2); an odd W's last
  word m[W - 1] is pair h, with a zero word;
- keys: for pair i, ``z0 = splitmix64(SEED + 2i)`` and ``z1 = splitmix64(SEED + 2i + 1)``;
  NH sum A keys with the low 32 bits of z0 and z1, NH sum B with their high 32 bits;
- ``A = sum_i ((m[i] + kA0[i]) mod 2**32) * ((m[i + h] + kA1[i]) mod 2**32)  mod 2**64``,
  B likewise;
- ``hash = (A mod P1) * 2**21 + (B mod P2)`` as float64 (exact below 2**53).

``SCHEME`` names this definition in every capture's attrs (``row_hash``), so a comparison can
tell when two stats captures hashed their rows differently (those written before the scheme
was recorded used 8 int8-GEMM lane sums) and report bit-equality as unknown instead of
false. Change ``SCHEME`` with any change to the definition.
"""

from __future__ import annotations

import numpy as np
import torch

SCHEME = "nh2-p52"
SEED = 0x4E48_2026
P1, P2 = 2_147_483_647, 2_097_143  # primes below 2**31 and 2**21: 31 + 21 = 52 hash bits

COMPILED_MIN = 1 << 14
"""Elements from which a CPU tensor takes the compiled kernels (``compiled_row_stats``: this hash,
and stats mode's fused pass). They load with numba, once per process: ~1.3 s of import and
on-disk cache here, while torch's path costs ~0.1 ms more a call below this size. So a tiny
model's capture (hidden 64 at 64 tokens: 4,096 elements a site), e.g. an RL run's mismatch
monitor, never loads them; both paths give the same bits."""
_keys_cache: dict[tuple[int, str], object] = {}


def row_hash(rows: torch.Tensor) -> torch.Tensor:
    """52-bit content hash of each row of ``rows`` [N, D] (float32 or int64, any device),
    float64 [N] on the CPU (see the module docstring for the definition)."""
    if rows.dim() != 2 or rows.element_size() not in (4, 8):
        raise ValueError(f"row_hash takes rows [N, D] of 4- or 8-byte values (float32, int64), got "
                         f"{rows.dtype} of shape {tuple(rows.shape)}: reshape to [N, -1] and widen first")
    words = rows.contiguous().view(torch.int32)  # [N, W]: a free view of the bytes
    if not words.is_cpu or words.numel() < COMPILED_MIN:
        return torch_row_hash(words).cpu()
    from aligntools.tracker.compiled_row_stats import hash_rows

    out = torch.empty(len(words), dtype=torch.float64)
    if len(words):
        hash_rows(words.numpy().view(np.uint32), keys(words.shape[1]), out.numpy())
    return out


def torch_row_hash(words: torch.Tensor) -> torch.Tensor:
    """``row_hash`` of int32 ``words`` [N, W] as float64 [N] on their device, in torch int64
    (wrapping, i.e. mod 2**64) from start to end: no value is read on the host, so a forward
    on an accelerator is never made to wait for it."""
    m = words.to(torch.int64) & 0xFFFFFFFF  # [N, W]
    h, odd = divmod(m.shape[1], 2)
    if odd:  # the last word's partner is a zero word
        lo, hi = torch.cat([m[:, :h], m[:, 2 * h:]], 1), torch.cat([m[:, h:2 * h], m.new_zeros(len(m), 1)], 1)
    else:
        lo, hi = m[:, :h], m[:, h:]  # [N, W/2] views
    k = keys(m.shape[1], words.device)  # [4, ceil(W/2)] int64
    a = (((lo + k[0]) & 0xFFFFFFFF) * ((hi + k[1]) & 0xFFFFFFFF)).sum(1)  # [N] uint64 sums in int64 bits
    b = (((lo + k[2]) & 0xFFFFFFFF) * ((hi + k[3]) & 0xFFFFFFFF)).sum(1)
    return ((_unsigned_mod(a, P1) << 21) | _unsigned_mod(b, P2)).to(torch.float64)


def _unsigned_mod(x: torch.Tensor, p: int) -> torch.Tensor:
    """``x`` int64 read as uint64, modulo ``p`` < 2**31: a negative x stands for x + 2**64."""
    return (x.remainder(p) + (x < 0) * (2 ** 64 % p)).remainder(p)


def keys(width: int, device: torch.device | None = None) -> np.ndarray | torch.Tensor:
    """The NH keys of a row of ``width`` words: uint32 [4, ceil(width / 2)] (numpy, for the
    compiled kernels), or int64 on ``device`` for the torch path. Cached per width."""
    h = (width + 1) // 2
    tag = str(device) if device is not None else "numpy"
    if (h, tag) not in _keys_cache:
        z = splitmix64(np.uint64(SEED) + np.arange(2 * h, dtype=np.uint64))  # [2h]
        z0, z1 = z[0::2], z[1::2]
        k = np.stack([z0, z1, z0 >> np.uint64(32), z1 >> np.uint64(32)]).astype(np.uint32)  # [4, h]: low / high halves
        _keys_cache[h, tag] = k if device is None else _on(torch.from_numpy(k.astype(np.int64)), torch.device(device))
    return _keys_cache[h, tag]


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """CPU ``t`` on ``device`` without making the host wait (pinned, non-blocking to CUDA)."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """Steele, Lea and Flood's SplitMix64 finaliser of uint64 ``x`` (wrapping arithmetic):
    fixed pseudo-random keys that no library version can change."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
