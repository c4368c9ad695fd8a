"""Stats mode's row hash: every path computes the written definition, and it sees every bit.

The reference below re-derives the hash from ``row_hash``'s definition with Python integers
(SplitMix64 keys, two NH sums modulo 2**64, residues modulo two primes), independently of the
compiled kernels and of torch's int64 arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools
from aligntools.tracker import row_hash, compiled_row_stats, stats

M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_hash(row: torch.Tensor) -> float:
    """The definition in ``aligntools.tracker.row_hash``'s docstring, with Python ints."""
    words = [w & 0xFFFFFFFF for w in row.contiguous().view(torch.int32).tolist()]
    h = len(words) // 2
    pairs = [(words[i], words[i + h]) for i in range(h)] + ([(words[-1], 0)] if len(words) % 2 else [])
    a = b = 0
    for i, (lo, hi) in enumerate(pairs):
        z0, z1 = splitmix64(row_hash.SEED + 2 * i), splitmix64(row_hash.SEED + 2 * i + 1)
        a += ((lo + (z0 & 0xFFFFFFFF)) & 0xFFFFFFFF) * ((hi + (z1 & 0xFFFFFFFF)) & 0xFFFFFFFF)
        b += ((lo + (z0 >> 32)) & 0xFFFFFFFF) * ((hi + (z1 >> 32)) & 0xFFFFFFFF)
    a, b = a & M64, b & M64
    return float((a % row_hash.P1) << 21 | (b % row_hash.P2))


def rows_of_every_width() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    floats = [torch.randn(3, d, generator=g) * 1e3 for d in (0, 1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 257)]
    extremes = torch.tensor([[-0.0, 0.0, float("nan"), float("inf"), -float("inf"), 3.4e38, -1e-45]])
    ints = torch.tensor([[0, -1, (1 << 63) - 1, -(1 << 63), 12345678901]])  # int64: two words each
    return [*floats, extremes, ints, torch.randn(2, 40_000, generator=g)]  # a row past the fused kernel's width


def test_the_compiled_kernels_bake_in_the_definitions_moduli():
    assert (compiled_row_stats.P1, compiled_row_stats.P2) == (row_hash.P1, row_hash.P2)


def test_splitmix64_is_the_published_generator():
    """SplitMix64 seeded with 0 first returns 0xE220A8397B1DCDAF (Vigna's reference code)."""
    assert int(row_hash.splitmix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF == splitmix64(0)


@pytest.mark.parametrize("x", rows_of_every_width(), ids=lambda x: f"{x.dtype}{tuple(x.shape)}")
def test_every_path_computes_the_definition(x):
    want = torch.tensor([reference_hash(r) for r in x], dtype=torch.float64)
    assert torch.equal(row_hash.row_hash(x), want)  # torch's path below COMPILED_MIN elements, else compiled
    words = x.contiguous().view(torch.int32)
    out = torch.empty(len(x), dtype=torch.float64)
    if len(x):
        compiled_row_stats.hash_rows(words.numpy().view(np.uint32), row_hash.keys(words.shape[1]), out.numpy())
    assert torch.equal(out, want)  # the compiled kernel, at every width
    assert torch.equal(row_hash.torch_row_hash(x.contiguous().view(torch.int32)), want)  # accelerators' path
    if x.is_floating_point() and 0 < x.shape[1] < 1 << 15:  # the fused stats pass
        out, _ = compiled_row_stats.row_sums(x, row_hash.keys(x.shape[1]))
        assert torch.equal(out[4], want)
    assert torch.equal(stats.row_stats(x)[:, 7], want)


def test_every_single_bit_flip_changes_the_hash():
    """All 32 x 65 one-bit changes of a row (sign, exponent, mantissa; both halves of the NH
    pairing and the odd last word) give 2080 hashes different from the row's and each other's."""
    row = torch.randn(1, 65, generator=torch.Generator().manual_seed(2))
    words = row.view(torch.int32).repeat(32 * 65, 1)  # [2080, 65]
    i = torch.arange(32 * 65)
    words[i, i // 32] ^= (torch.ones_like(i) << (i % 32)).to(torch.int32)
    hashes = row_hash.row_hash(words.view(torch.float32))
    assert len(set(hashes.tolist()) | {float(row_hash.row_hash(row)[0])}) == 32 * 65 + 1


def test_hash_is_the_row_content_not_its_layout():
    x = torch.randn(6, 50)
    assert torch.equal(row_hash.row_hash(x.t().contiguous().t()), row_hash.row_hash(x))
    assert torch.equal(row_hash.row_hash(x[::2]), row_hash.row_hash(x)[::2])


def test_captures_record_their_hash_scheme(hf_model, ids):
    cap = aligntools.capture(hf_model("tiny-llama"), ids, mode="stats", progress=False)
    assert cap.dataset.attrs["row_hash"] == row_hash.SCHEME


@pytest.mark.parametrize("bad", [torch.randn(5), torch.randn(2, 3, 4), torch.randn(2, 3).bfloat16(),
                                 torch.zeros(2, 3, dtype=torch.bool)], ids=["1-D", "3-D", "bf16", "bool"])
def test_rows_that_are_not_4_or_8_byte_rows_are_refused(bad):
    with pytest.raises(ValueError, match=r"row_hash takes rows \[N, D\]"):
        row_hash.row_hash(bad)


def test_no_rows_hash_to_nothing():
    assert row_hash.row_hash(torch.empty(0, 7)).shape == (0,)
    assert row_hash.row_hash(torch.empty(0, 7, dtype=torch.int64)).dtype == torch.float64


@pytest.mark.gpu
def test_rows_on_the_gpu_hash_as_on_the_cpu():
    """Rows captured on CUDA take the torch int64 path on the device (no copy of the rows)."""
    for x in rows_of_every_width():
        assert torch.equal(row_hash.row_hash(x.cuda()), row_hash.row_hash(x))
        assert torch.equal(stats.row_stats(x.cuda())[:, 7], row_hash.row_hash(x))
