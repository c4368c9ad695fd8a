"""Fused token logprobs + entropy: float64 truth, gradcheck, chunked memory, the Triton kernels."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.kernels_testutil import impl_cases, max_rel_err
from tests.kernels.kernels_testutil import variant as variant_fn

import kernels

ALL_VARIANTS = impl_cases("logprobs", ["naive", "chunked"])  # with "chunked/triton"
FUSED = ["chunked", "chunked/triton"]


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
    lp, ent = variant_fn("logprobs", variant)(hidden, weight, targets, temperature=temperature, chunk_size=4)
    t_lp, t_ent = truth(hidden, weight, targets, temperature)
    assert lp.dtype == ent.dtype == torch.float64
    assert torch.allclose(lp, t_lp, rtol=0, atol=1e-12) and torch.allclose(ent, t_ent, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", FUSED)
def test_gradcheck_float64(variant):
    hidden, weight, targets = data(torch.float64, n=5, h=4, v=7, requires_grad=True)
    fn = lambda h, w: variant_fn("logprobs", variant)(h, w, targets, temperature=0.8, chunk_size=2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (hidden, weight))


@pytest.mark.parametrize("variant", FUSED)
def test_backward_matches_autograd_of_naive(variant):
    hidden, weight, targets = data(torch.float64, requires_grad=True)
    g = torch.Generator().manual_seed(3)
    up_lp, up_ent = torch.randn(9, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    grads = []
    for name in ("naive", variant):
        lp, ent = variant_fn("logprobs", name)(hidden, weight, targets, temperature=0.7, chunk_size=4)
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
    saved: dict[str, list[int]] = {"naive": [], "chunked": [], "chunked/triton": []}
    for name in saved:
        with torch.autograd.graph.saved_tensors_hooks(lambda t, n=name: saved[n].append(t.numel()) or t, lambda t: t):
            variant_fn("logprobs", name)(hidden, weight, targets, chunk_size=8)
    n_times_v = 64 * 300
    assert max(saved["naive"]) >= n_times_v
    assert max(saved["chunked"]) < n_times_v / 4 and max(saved["chunked/triton"]) < n_times_v / 4


def test_triton_backward_buffer_is_bounded_by_chunk_size():
    """The Triton backward's [N, columns] buffer holds at most chunk_size * V elements (the torch
    variant's [chunk, V]), whole vocabulary tiles when wider than one, and at least one column."""
    from kernels.triton_logprobs import GRAD_CHUNK_BYTES, grad_chunk_columns

    assert grad_chunk_columns(64, 300, 4, 32, chunk_size=8) * 64 <= 8 * 300
    assert grad_chunk_columns(64, 300, 4, 32, chunk_size=8) % 32 == 0
    assert grad_chunk_columns(10_000, 300, 4, 32, chunk_size=1) == 1
    assert grad_chunk_columns(9, 20, 2, 32, chunk_size=None) == 20  # V smaller than the budget
    cols = grad_chunk_columns(2048, 151_936, 2, 128, chunk_size=None)
    assert cols % 128 == 0 and 2048 * cols * 2 <= GRAD_CHUNK_BYTES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_matches_naive(dtype):
    hidden, weight, targets = data(dtype, n=33)
    a = kernels.get("logprobs", "naive")(hidden, weight, targets, temperature=0.9)
    b = kernels.get("logprobs", "chunked")(hidden, weight, targets, temperature=0.9, chunk_size=5)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype == torch.float32
        assert torch.allclose(x, y, rtol=0, atol=1e-5)


def rounded_truth(hidden, weight, targets, temperature, up_lp, up_ent):
    """float64 transcription of the fused numerics: logits rounded to the inputs' dtype (the GEMM
    output), then float64 log-softmax, entropy and, by float64 autograd (the rounding taken as the
    identity), the gradients of ``sum(up_lp * logprob + up_ent * entropy)``."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    z = h @ w.T
    z = z + (z.detach().to(hidden.dtype).double() - z.detach())  # the rounded values, identity gradient
    logp = torch.log_softmax(z / temperature, dim=-1)
    lp = logp[torch.arange(len(targets)), targets]
    ent = -(logp.exp() * logp).sum(-1)
    g_h, g_w = torch.autograd.grad((lp * up_lp + ent * up_ent).sum(), (h, w))
    return lp.detach(), ent.detach(), g_h, g_w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "h", "v"), [(7, 16, 10), (9, 40, 150), (33, 48, 75)])
def test_triton_forward_and_gradients_match_float64(dtype, n, h, v):
    """V = 10 is smaller than one vocabulary tile; 150 and 75 are not multiples of it and span
    several vocabulary splits, so the cross-program log-sum-exp merge runs."""
    hidden, weight, targets = data(dtype, n=n, h=h, v=v, requires_grad=True)
    g = torch.Generator().manual_seed(4)
    up_lp, up_ent = torch.randn(n, generator=g), torch.randn(n, generator=g)
    up_lp[1] = up_ent[1] = 0.0  # an ignored row: no gradient from it
    lp, ent = kernels.get("logprobs", "chunked", impl="triton")(hidden, weight, targets, temperature=0.7, chunk_size=4)
    g_h, g_w = torch.autograd.grad((lp * up_lp + ent * up_ent).sum(), (hidden, weight))
    t_lp, t_ent, t_gh, t_gw = rounded_truth(hidden, weight, targets, 0.7, up_lp.double(), up_ent.double())
    assert lp.dtype == ent.dtype == torch.float32 and g_h.dtype == g_w.dtype == dtype
    # fp32 accumulation order vs float64: in bf16 it may flip a logit's rounding by one ulp
    logit_max = float(t_lp.abs().max() + t_ent.abs().max())
    atol = 2e-5 if dtype == torch.float32 else logit_max * 2**-7
    assert torch.allclose(lp.double(), t_lp, rtol=0, atol=atol) and torch.allclose(ent.double(), t_ent, rtol=0, atol=atol)
    # gradients: the logit gradient is rounded to the input dtype before two GEMMs whose output
    # is rounded again: a few ulps of the input dtype, norm-wise
    bound = 1e-5 if dtype == torch.float32 else 2**-6
    assert max_rel_err(g_h, t_gh) < bound and max_rel_err(g_w, t_gw) < bound
    assert float(g_h[1].abs().max()) == 0.0 and torch.isfinite(g_w).all()


def test_triton_extreme_logits_and_single_row():
    """Logits of +-1000 (a peaked softmax: exp underflows everywhere but the max), one row."""
    hidden, weight, targets = data(torch.float32, n=5, h=16, v=40, requires_grad=True)
    big = (hidden * 100).detach().requires_grad_()
    for rows in (slice(None), slice(0, 1)):
        h_in, t_in = big[rows], targets[rows]
        lp, ent = kernels.get("logprobs", "chunked", impl="triton")(h_in, weight, t_in)
        g_h, g_w = torch.autograd.grad((lp + ent).sum(), (big, weight))
        t_lp, t_ent, t_gh, t_gw = rounded_truth(h_in, weight, t_in, 1.0, torch.ones(len(t_in), dtype=torch.float64),
                                                torch.ones(len(t_in), dtype=torch.float64))
        assert float(t_lp.abs().max()) > 50  # really extreme
        assert torch.allclose(lp.double(), t_lp, rtol=1e-6, atol=1e-3) and torch.allclose(ent.double(), t_ent, atol=1e-4)
        assert max_rel_err(g_h[rows], t_gh) < 1e-4 and max_rel_err(g_w, t_gw) < 1e-4


def test_triton_empty_batch():
    hidden, weight, targets = data(torch.float32, n=0, requires_grad=True)
    lp, ent = kernels.get("logprobs", "chunked", impl="triton")(hidden, weight, targets)
    assert lp.shape == ent.shape == (0,)
    g_h, g_w = torch.autograd.grad((lp.sum() + ent.sum()), (hidden, weight), allow_unused=True)
    assert g_h.shape == (0, 24) and (g_w is None or float(g_w.abs().max()) == 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_torch_chunked(dtype):
    hidden, weight, targets = data(dtype, n=9, h=40, v=150, requires_grad=True)  # V and H span several tiles
    outs = []
    for impl in ("torch", "triton"):
        lp, ent = kernels.get("logprobs", "chunked", impl=impl)(hidden, weight, targets, temperature=0.7)
        outs.append((lp, ent, *torch.autograd.grad((lp + 0.3 * ent).sum(), (hidden, weight))))
    logit_max = float((hidden.detach().float() @ weight.detach().float().T).abs().max()) / 0.7
    atol = 2e-5 if dtype == torch.float32 else logit_max * 2**-8
    for a, b in zip(outs[0][:2], outs[1][:2]):
        assert a.dtype == b.dtype == torch.float32 and torch.allclose(a, b, rtol=0, atol=atol)
    for a, b in zip(outs[0][2:], outs[1][2:]):
        assert a.dtype == b.dtype == dtype and max_rel_err(b, a) < (1e-5 if dtype == torch.float32 else 2**-6)


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
    lp, ent = variant_fn("logprobs", variant)(hidden, weight, targets, chunk_size=4)
    assert torch.isnan(lp[2]) and torch.isnan(ent[2])
    keep = torch.arange(9) != 2
    assert torch.isfinite(lp[keep]).all() and torch.isfinite(ent[keep]).all()


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_non_contiguous_inputs_are_handled(variant):
    hidden, weight, targets = data(torch.float32)
    ht, wt = hidden.T.contiguous().T, weight.T.contiguous().T
    assert not ht.is_contiguous() and not wt.is_contiguous()
    a = variant_fn("logprobs", variant)(ht, wt, targets)
    b = variant_fn("logprobs", variant)(hidden, weight, targets)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_bad_inputs_raise_with_names_and_shapes(variant):
    f = variant_fn("logprobs", variant)
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
