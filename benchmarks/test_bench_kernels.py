"""pytest-benchmark timings of every kernel variant (no timed asserts; compare in the report).

    .venv/bin/python -m pytest benchmarks/test_bench_kernels.py --benchmark-enable -q

CPU: the torch variants against the op's baseline (``group`` = op, so the table puts them side
by side). GPU (``gpu`` marker, skipped without CUDA): compiled Triton vs torch eager.
"""

from __future__ import annotations

import pytest
import torch

import kernels

CUDA = torch.cuda.is_available()
# benchmarks/ is outside tests/, so the suite conftest's gpu auto-skip does not apply here
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def make_case(op: str, device: str, dtype: torch.dtype = torch.bfloat16):
    """Inputs and a call for ``op`` at a size that takes milliseconds on CPU."""
    g = torch.Generator().manual_seed(0)
    big = device == "cuda"
    if op == "rmsnorm":
        x = torch.randn(4096 if big else 512, 4096 if big else 1024, generator=g).to(device, dtype)
        w = torch.ones(x.shape[1], dtype=dtype, device=device)
        return lambda f: f(x, w, 1e-6, x)
    if op == "rope":
        q = torch.randn(4096 if big else 512, 32 if big else 8, 128, generator=g).to(device, dtype)
        pos = torch.arange(q.shape[0], device=device)
        return lambda f: f(q, pos, theta=1e6, rotary_dim=128)
    if op == "router_topk":
        logits = torch.randn(16384 if big else 2048, 128 if big else 64, generator=g).to(device, dtype)
        return lambda f: f(logits, 8)
    n, h, v = (4096, 2048, 151_936) if big else (128, 128, 32_768)
    hidden = torch.randn(n, h, generator=g).to(device, dtype)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(device, dtype)
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    return lambda f: f(hidden, weight, targets)


CPU_CASES = [(op, v) for op in kernels.ops() for v in kernels.variants(op)]
TRITON_CASES = [(op, v) for op in kernels.ops() for v in kernels.variants(op) if "triton" in kernels.impls(op, v)]


@pytest.mark.parametrize(("op", "variant"), CPU_CASES, ids=[f"{o}-{v}" for o, v in CPU_CASES])
def test_cpu_torch_variant(benchmark, op, variant):
    benchmark.group = f"cpu {op}"
    call = make_case(op, "cpu")
    out = benchmark(call, kernels.get(op, variant, impl="torch"))
    assert out is not None


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("op", "variant"), TRITON_CASES, ids=[f"{o}-{v}" for o, v in TRITON_CASES])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_gpu_triton_vs_torch_eager(benchmark, op, variant, impl):
    benchmark.group = f"cuda {op} {variant}"
    call = make_case(op, "cuda")
    f = kernels.get(op, variant, impl=impl)

    def run():
        out = call(f)
        torch.cuda.synchronize()
        return out

    assert benchmark(run) is not None
