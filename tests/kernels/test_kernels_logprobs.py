"""Fused token logprobs + entropy: float64 truth, gradcheck, chunked memory, Triton forward."""

from __future__ import annotations

import pytest
import torch

import kernels

ALL_VARIANTS = ["naive", "chunked", "triton"]


def truth(hidden, weight, targets, temperature=1.0):
    """float64 logprob/entropy from the definitions (max-shifted logsumexp, -sum p log p)."""
    z = hidden.double() @ weight.double().T / temperature  # [N, V]
    shifted = z - z.max(dim=-1, keepdim=True).values
    logp = shifted - shifted.exp().sum(-1, keepdim=True).log()
    return logp[torch.arange(len(targets)), targets], -(logp.exp() * logp).sum(-1)


def data(dtype, n=9, h=24, v=75, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_(requires_grad)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_(requires_grad)
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_float64_forward_matches_truth(variant, temperature):
    hidden, weight, targets = data(torch.float64)
    lp, ent = kernels.get("logprobs", variant)(hidden, weight, targets, temperature=temperature, chunk_size=4)
    t_lp, t_ent = truth(hidden, weight, targets, temperature)
    assert lp.dtype == ent.dtype == torch.float64
    assert torch.allclose(lp, t_lp, rtol=0, atol=1e-12) and torch.allclose(ent, t_ent, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["chunked", "triton"])
def test_gradcheck_float64(variant):
    hidden, weight, targets = data(torch.float64, n=5, h=4, v=7, requires_grad=True)
    fn = lambda h, w: kernels.get("logprobs", variant)(h, w, targets, temperature=0.8, chunk_size=2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (hidden, weight))


@pytest.mark.parametrize("variant", ["chunked", "triton"])
def test_backward_matches_autograd_of_naive(variant):
    hidden, weight, targets = data(torch.float64, requires_grad=True)
    g = torch.Generator().manual_seed(3)
    up_lp, up_ent = torch.randn(9, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    grads = []
    for name in ("naive", variant):
        lp, ent = kernels.get("logprobs", name)(hidden, weight, targets, temperature=0.7, chunk_size=4)
        grads.append(torch.autograd.grad((lp * up_lp + ent * up_ent).sum(), (hidden, weight)))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_backward_with_only_one_output_used():
    hidden, weight, targets = data(torch.float64, requires_grad=True)
    lp, _ = kernels.get("logprobs", "chunked")(hidden, weight, targets, chunk_size=3)
    g_chunked = torch.autograd.grad(lp.sum(), hidden)[0]
    lp_n, _ = kernels.get("logprobs", "naive")(hidden, weight, targets)
    assert torch.allclose(g_chunked, torch.autograd.grad(lp_n.sum(), hidden)[0], rtol=1e-10, atol=1e-12)


def test_chunked_saves_nothing_of_size_n_times_v():
    """Peak memory O(chunk * V): autograd keeps no [N, V] tensor between forward and backward."""
    hidden, weight, targets = data(torch.float32, n=64, h=8, v=300, requires_grad=True)
    saved: dict[str, list[int]] = {"naive": [], "chunked": []}
    for name in saved:
        with torch.autograd.graph.saved_tensors_hooks(lambda t, n=name: saved[n].append(t.numel()) or t, lambda t: t):
            kernels.get("logprobs", name)(hidden, weight, targets, chunk_size=8)
    n_times_v = 64 * 300
    assert max(saved["naive"]) >= n_times_v
    assert max(saved["chunked"]) < n_times_v / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_matches_naive(dtype):
    hidden, weight, targets = data(dtype, n=33)
    a = kernels.get("logprobs", "naive")(hidden, weight, targets, temperature=0.9)
    b = kernels.get("logprobs", "chunked")(hidden, weight, targets, temperature=0.9, chunk_size=5)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype == torch.float32
        assert torch.allclose(x, y, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_chunked(dtype):
    hidden, weight, targets = data(dtype, n=9, h=40, v=150)  # V and H span several tiles
    a = kernels.get("logprobs", "triton")(hidden, weight, targets, temperature=0.7)
    b = kernels.get("logprobs", "chunked")(hidden, weight, targets, temperature=0.7)
    # fp32 accumulation order differs; in bf16 that may flip a logit's rounding by one bf16
    # ulp (2**-8 relative), bounded below by |logit| * 2**-8 / T
    logit_max = float((hidden.float() @ weight.float().T).abs().max()) / 0.7
    atol = 2e-5 if dtype == torch.float32 else logit_max * 2**-8
    for x, y in zip(a, b):
        assert x.dtype == torch.float32 and torch.allclose(x, y, rtol=0, atol=atol)


def test_bf16_logits_error_vs_float64_is_the_gemm_rounding():
    """Expected direction: the bf16 GEMM (bf16-rounded logits) dominates the error; fp32 inputs
    are ~1000x closer to float64."""
    hidden, weight, targets = data(torch.float64, n=32, h=64, v=200)
    t_lp, _ = truth(hidden, weight, targets)
    err = {}
    for dtype in (torch.float32, torch.bfloat16):
        lp, _ = kernels.get("logprobs", "chunked")(hidden.to(dtype), weight.to(dtype), targets)
        err[dtype] = float((lp.double() - t_lp).abs().max())
    assert err[torch.float32] * 100 < err[torch.bfloat16]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, interpreter
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_nan_hidden_row_propagates_to_its_row_only(variant):
    hidden, weight, targets = data(torch.float32)
    hidden[2, 3] = float("nan")
    lp, ent = kernels.get("logprobs", variant)(hidden, weight, targets, chunk_size=4)
    assert torch.isnan(lp[2]) and torch.isnan(ent[2])
    keep = torch.arange(9) != 2
    assert torch.isfinite(lp[keep]).all() and torch.isfinite(ent[keep]).all()


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_non_contiguous_inputs_are_handled(variant):
    hidden, weight, targets = data(torch.float32)
    ht, wt = hidden.T.contiguous().T, weight.T.contiguous().T
    assert not ht.is_contiguous() and not wt.is_contiguous()
    a = kernels.get("logprobs", variant)(ht, wt, targets)
    b = kernels.get("logprobs", variant)(hidden, weight, targets)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_bad_inputs_raise_with_names_and_shapes(variant):
    f = kernels.get("logprobs", variant)
    hidden, weight, targets = data(torch.float32)
    with pytest.raises(ValueError, match=r"hidden\[9, 24\].*weight\[75, 23\]"):
        f(hidden, weight[:, :23], targets)
    with pytest.raises(ValueError, match=r"hidden\[9, 24\].*targets\[8\]"):
        f(hidden, weight, targets[:8])
    with pytest.raises(TypeError, match=r"hidden\[9, 24\] float32.*weight\[75, 24\] bfloat16"):
        f(hidden, weight.bfloat16(), targets)
    with pytest.raises(ValueError, match=r"targets\[9\].*\[0, V=75\)"):
        f(hidden, weight, torch.full((9,), 75))
    with pytest.raises(TypeError, match=r"targets\[9\] float32"):
        f(hidden, weight, targets.float())
    for t in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            f(hidden, weight, targets, temperature=t)


def test_bad_chunk_size():
    hidden, weight, targets = data(torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        kernels.get("logprobs", "chunked")(hidden, weight, targets, chunk_size=0)


def test_default_chunk_bounds_the_chunk_logits():
    from kernels.logprobs import CHUNK_ELEMENTS, chunk_rows

    rows = chunk_rows(151_936, None)
    assert rows >= 1 and rows * 151_936 <= CHUNK_ELEMENTS
