"""Compiled Triton kernels on CUDA at realistic sizes, and the logprobs memory goal there.

Marked ``gpu``: auto-skipped with a reason on machines without CUDA (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from tests.kernels.kernels_testutil import max_ulps
from tests.kernels.test_kernels_rope import fp32_angle_truth

import kernels

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


def test_auto_dispatch_runs_triton_on_cuda():
    x, w = _randn(4, 64), _randn(64, seed=1)
    auto = kernels.get("rmsnorm", "hf")(x, w, 1e-6)
    assert torch.equal(auto, kernels.get("rmsnorm", "hf", impl="triton")(x, w, 1e-6))


@pytest.mark.parametrize("name", ["reference", "hf", "fused_add", "fp32_residual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_triton_compiled(name, dtype):
    x, r, w = _randn(1024, 4096, dtype=dtype), _randn(1024, 4096, dtype=dtype, seed=1), _randn(4096, dtype=dtype, seed=2)
    got = kernels.get("rmsnorm", name, impl="triton")(x, w, 1e-6, r)
    want = kernels.get("rmsnorm", name, impl="torch")(x, w, 1e-6, r)
    assert torch.equal(got[1], want[1])
    if dtype == torch.float32:  # GPU rsqrt is approximate (~2 ulp)
        assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    else:
        assert max_ulps(got[0], want[0], dtype, floor_rel=1e-3) <= 1


@pytest.mark.parametrize("name", ["fp32_compute", "hf"])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_triton_compiled(name, style):
    x, pos = _randn(512, 16, 128), torch.randint(0, 32768, (512,), device=DEV)
    got = kernels.get("rope", name, impl="triton")(x, pos, theta=1e6, rotary_dim=64, style=style)
    want = kernels.get("rope", name, impl="torch")(x, pos, theta=1e6, rotary_dim=64, style=style)
    assert max_ulps(got, want, torch.bfloat16, floor_rel=1e-3) <= (1 if name == "fp32_compute" else 2)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_rope_large_positions_match_float64_of_fp32_angles_on_the_card(impl):
    """Where the card's approximate sin/cos showed (3 bf16 ulps at position ~32768, theta 1e6)."""
    x = _randn(256, 4, 128)
    pos = torch.randint(0, 1 << 20, (256,), generator=torch.Generator().manual_seed(3)).to(DEV)
    got = kernels.get("rope", "fp32_compute", impl=impl)(x, pos, theta=1e6, rotary_dim=128)
    want = fp32_angle_truth(x.cpu(), pos.cpu(), 1e6, 128, "neox")
    assert max_ulps(got.cpu(), want, torch.bfloat16, floor_rel=1e-3) <= 1


@pytest.mark.parametrize("compute_dtype", [None, torch.bfloat16])
def test_router_triton_compiled(compute_dtype):
    logits = torch.cat([_randn(4096, 128), torch.randint(0, 3, (64, 128), device=DEV).bfloat16()])
    got = kernels.get("router_topk", "stable", impl="triton")(logits, 8, compute_dtype=compute_dtype)
    want = kernels.get("router_topk", "stable", impl="torch")(logits, 8, compute_dtype=compute_dtype)
    assert torch.equal(got[0], want[0])
    assert torch.allclose(got[1].float(), want[1].float(), rtol=1e-6 if compute_dtype is None else 2**-8, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_triton_compiled(dtype):
    h = _randn(512, 1024, dtype=dtype).requires_grad_()
    w = (_randn(32768, 1024, dtype=dtype, seed=1) / 32).requires_grad_()
    t = torch.randint(0, 32768, (512,), device=DEV)
    outs = []
    for impl in ("triton", "torch"):
        lp, ent = kernels.get("logprobs", "chunked", impl=impl)(h, w, t)
        outs.append((lp, ent, *torch.autograd.grad((lp + 0.1 * ent).sum(), (h, w))))
    logit_max = float((h.detach().float() @ w.detach().float().T).abs().max())
    atol = 1e-4 if dtype == torch.float32 else logit_max * 2**-8
    for a, b in zip(outs[0][:2], outs[1][:2]):
        assert torch.allclose(a, b, rtol=0, atol=atol)
    for a, b in zip(outs[0][2:], outs[1][2:]):
        rel = float((a.double() - b.double()).abs().max() / b.double().abs().max())
        assert rel < (1e-4 if dtype == torch.float32 else 2**-6)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_logprobs_peak_memory_quarter_of_naive_at_qwen_vocab(impl):
    def peak(fn):
        h = _randn(4096, 1024).requires_grad_()
        w = (_randn(151_936, 1024, seed=1) / 32).requires_grad_()
        t = torch.randint(0, 151_936, (4096,), device=DEV)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        lp, ent = fn(h, w, t)
        (lp.sum() + ent.sum()).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    fused = kernels.get("logprobs", "chunked", impl=impl)
    peak(fused)  # compile / warm-up
    assert peak(fused) <= peak(kernels.get("logprobs", "naive")) / 4
