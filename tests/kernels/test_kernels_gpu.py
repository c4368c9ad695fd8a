"""Compiled Triton kernels on CUDA at realistic sizes, and the logprobs memory goal there.

Marked ``gpu``: auto-skipped with a reason on machines without CUDA (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from tests.kernels.kernels_testutil import max_ulps

import kernels

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_triton_compiled(dtype):
    x, r, w = _randn(1024, 4096, dtype=dtype), _randn(1024, 4096, dtype=dtype, seed=1), _randn(4096, dtype=dtype, seed=2)
    got = kernels.get("rmsnorm", "triton")(x, w, 1e-6, r)
    want = kernels.get("rmsnorm", "reference")(x, w, 1e-6, r)
    assert torch.equal(got[1], want[1])
    if dtype == torch.float32:  # GPU rsqrt is approximate (~2 ulp)
        assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    else:
        assert max_ulps(got[0], want[0], dtype) <= 1


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_triton_compiled(style):
    x, pos = _randn(512, 16, 128), torch.randint(0, 32768, (512,), device=DEV)
    got = kernels.get("rope", "triton")(x, pos, theta=1e6, rotary_dim=64, style=style)
    want = kernels.get("rope", "fp32_compute")(x, pos, theta=1e6, rotary_dim=64, style=style)
    assert max_ulps(got, want, torch.bfloat16) <= 1


@pytest.mark.parametrize("compute_dtype", [None, torch.bfloat16])
def test_router_triton_compiled(compute_dtype):
    logits = torch.cat([_randn(4096, 128), torch.randint(0, 3, (64, 128), device=DEV).bfloat16()])
    got = kernels.get("router_topk", "triton")(logits, 8, compute_dtype=compute_dtype)
    want = kernels.get("router_topk", "stable")(logits, 8, compute_dtype=compute_dtype)
    assert torch.equal(got[0], want[0])
    assert torch.allclose(got[1].float(), want[1].float(), rtol=1e-6 if compute_dtype is None else 2**-8, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_triton_compiled(dtype):
    h, w = _randn(512, 1024, dtype=dtype), _randn(32768, 1024, dtype=dtype, seed=1) / 32
    t = torch.randint(0, 32768, (512,), device=DEV)
    got = kernels.get("logprobs", "triton")(h, w, t)
    want = kernels.get("logprobs", "chunked")(h, w, t)
    logit_max = float((h.float() @ w.float().T).abs().max())
    atol = 1e-4 if dtype == torch.float32 else logit_max * 2**-8
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=0, atol=atol)


@pytest.mark.parametrize("variant", ["chunked", "triton"])
def test_logprobs_peak_memory_quarter_of_naive_at_qwen_vocab(variant):
    def peak(name):
        h = _randn(4096, 1024).requires_grad_()
        w = (_randn(151_936, 1024, seed=1) / 32).requires_grad_()
        t = torch.randint(0, 151_936, (4096,), device=DEV)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        lp, ent = kernels.get("logprobs", name)(h, w, t)
        (lp.sum() + ent.sum()).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    peak(variant)  # compile / warm-up
    assert peak(variant) <= peak("naive") / 4
