"""RMSNorm variants against an independent float64 formula, transformers, and each other."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.kernels_testutil import impl_cases, max_rel_err, max_ulps, mean_abs_err, ulp
from tests.kernels.kernels_testutil import variant as variant_fn

import kernels

TORCH_VARIANTS = ["reference", "hf", "fused_add", "fp32_residual", "bf16_compute"]
ALL_VARIANTS = impl_cases("rmsnorm", TORCH_VARIANTS)  # with "reference/triton", "hf/triton", ...
TRITON_VARIANTS = [v for v in TORCH_VARIANTS if "triton" in kernels.impls("rmsnorm", v)]
EPS = 1e-5


def truth(x, w, eps, residual=None):
    """float64 RMSNorm written from the formula, not from kernels.rmsnorm."""
    h = x.double() if residual is None else x.double() + residual.double()
    return h / torch.sqrt((h * h).sum(-1, keepdim=True) / h.shape[-1] + eps) * w.double()


def data(dtype, shape=(6, 64), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)
    r = (4 * torch.randn(shape, generator=g)).to(dtype)
    return x, w, r


def test_reference_is_float64_truth():
    x, w, r = data(torch.float64)
    assert torch.allclose(kernels.get("rmsnorm", "reference")(x, w, EPS), truth(x, w, EPS), rtol=1e-14, atol=0)
    y, new_r = kernels.get("rmsnorm", "reference")(x, w, EPS, r)
    assert torch.allclose(y, truth(x, w, EPS, r), rtol=1e-14, atol=0)
    assert torch.equal(new_r, x + r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hf_is_bit_exact_vs_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, w, r = data(dtype, shape=(3, 5, 64))
    module = LlamaRMSNorm(64, eps=EPS).to(dtype)
    with torch.no_grad():
        module.weight.copy_(w)
        expected = module(x)
        expected_res = module(r + x)  # what a transformers decoder layer feeds its norm
    hf = kernels.get("rmsnorm", "hf")
    assert torch.equal(hf(x, module.weight.detach(), EPS), expected)
    y, new_r = hf(x, module.weight.detach(), EPS, r)
    assert torch.equal(y, expected_res) and torch.equal(new_r, r + x)


def test_hf_keeps_torch_promotion_with_fp32_weight():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, w, _ = data(torch.bfloat16)
    module = LlamaRMSNorm(64, eps=EPS)  # fp32 weight, bf16 activations: output promotes to fp32
    with torch.no_grad():
        module.weight.copy_(w.float())
        expected = module(x)
    y = kernels.get("rmsnorm", "hf")(x, module.weight.detach(), EPS)
    assert y.dtype == torch.float32 and torch.equal(y, expected)


@pytest.mark.parametrize("variant", TORCH_VARIANTS)
def test_eps_is_a_parameter(variant):
    # rows of tiny values: eps dominates mean(x^2), so a hard-coded eps would be far off
    x, w, _ = data(torch.float32)
    x = x * 1e-2
    for eps in (1e-6, 1e-2):
        y = kernels.get("rmsnorm", variant)(x, w, eps)
        tol = 2e-2 if variant == "bf16_compute" else 1e-5
        assert max_rel_err(y, truth(x, w, eps)) < tol, eps


def test_fp32_residual_matches_float64_to_1e6_relative():
    x, w, r = data(torch.float64)
    f = kernels.get("rmsnorm", "fp32_residual")
    err = max_rel_err(f(x, w, EPS), truth(x, w, EPS))
    assert 0 < err <= 1e-6  # pinned to fp32 math: differs from float64, but only by fp32 rounding
    y, new_r = f(x.float(), w.float(), EPS, r.float())
    assert max_rel_err(y, truth(x, w, EPS, r)) <= 1e-6
    assert new_r.dtype == torch.float32


def test_fp32_residual_accepts_and_returns_fp32_residual_with_bf16_activations():
    x, w, r = data(torch.bfloat16)
    r32 = r.float() + 1e-3  # not bf16-representable
    y, new_r = kernels.get("rmsnorm", "fp32_residual")(x, w, EPS, r32)
    assert y.dtype == torch.bfloat16 and new_r.dtype == torch.float32
    assert torch.equal(new_r, x.float() + r32)


def test_bf16_compute_differs_even_on_fp32_inputs():
    x, w, _ = data(torch.float32)
    t = truth(x, w, EPS)
    bf16 = max_rel_err(kernels.get("rmsnorm", "bf16_compute")(x, w, EPS), t)
    ref = max_rel_err(kernels.get("rmsnorm", "reference")(x, w, EPS), t)
    assert bf16 > 1e-3 > 1e-6 > ref


def test_error_ordering_in_bf16():
    """Expected direction: one rounding (reference) < two roundings (hf) < all-bf16."""
    x, w, _ = data(torch.bfloat16, shape=(64, 256))
    t = truth(x, w, EPS)
    err = {v: mean_abs_err(kernels.get("rmsnorm", v)(x, w, EPS), t) for v in TORCH_VARIANTS}
    assert err["reference"] == err["fp32_residual"]  # same math for bf16 inputs without residual
    assert err["reference"] < err["hf"] < err["bf16_compute"]
    assert err["fused_add"] == pytest.approx(err["hf"], rel=0.05)


def test_fp32_residual_stream_beats_bf16_residual_stream():
    """Ring-linear's aligned setting: an fp32 residual stream is closer to float64 than the
    bf16 stream that hf (decoder layer) and fused_add (vLLM) carry."""
    x, w, r = data(torch.bfloat16, shape=(64, 256))
    r32 = r.float() * (1 + 1e-3 * torch.randn(r.shape, generator=torch.Generator().manual_seed(1)))
    t = truth(x, w, EPS, r32)
    aligned = mean_abs_err(kernels.get("rmsnorm", "fp32_residual")(x, w, EPS, r32)[0], t)
    for variant in ("hf", "fused_add"):
        y, new_r = kernels.get("rmsnorm", variant)(x, w, EPS, r32.bfloat16())
        assert new_r.dtype == torch.bfloat16
        assert mean_abs_err(y, t) > 1.5 * aligned, variant


def test_fused_add_equals_hf_with_activation_dtype_weight():
    """vLLM's kernel and HF's decoder layer round at the same places; only the fp32 variance
    reduction order may differ, which moves an output by at most one bf16 ulp."""
    x, w, r = data(torch.bfloat16, shape=(32, 128))
    y_hf, r_hf = kernels.get("rmsnorm", "hf")(x, w, EPS, r)
    y_fa, r_fa = kernels.get("rmsnorm", "fused_add")(x, w, EPS, r)
    assert torch.equal(r_hf, r_fa)
    assert max_ulps(y_fa, y_hf, torch.bfloat16) <= 1


@pytest.mark.parametrize("name", TRITON_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_matches_torch(name, dtype, with_residual):
    x, w, r = data(dtype, shape=(2, 3, 40))  # 3-D input, H not a power of two
    args = (x, w, EPS, r) if with_residual else (x, w, EPS)
    got = kernels.get("rmsnorm", name, impl="triton")(*args)
    want = kernels.get("rmsnorm", name, impl="torch")(*args)
    got, want = (got, want) if with_residual else ((got,), (want,))
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        if dtype == torch.float32:
            assert torch.allclose(g, e, rtol=4 * ulp(dtype), atol=1e-7)
        else:  # same roundings in both; the fp32 variance's summation order may flip one by an ulp
            assert max_ulps(g, e, dtype) <= 1


def test_triton_hf_keeps_torch_promotion_with_fp32_weight():
    x, w, r = data(torch.bfloat16, shape=(5, 40))
    got = kernels.get("rmsnorm", "hf", impl="triton")(x, w.float(), EPS, r)
    want = kernels.get("rmsnorm", "hf", impl="torch")(x, w.float(), EPS, r)
    assert got[0].dtype == want[0].dtype == torch.float32 and torch.equal(got[1], want[1])
    assert torch.allclose(got[0], want[0], rtol=4 * ulp(torch.float32), atol=0)


def test_triton_rows_per_program_cover_every_row():
    """Many narrow rows: a program owns several rows, and the last program a partial block."""
    x, w, r = data(torch.float32, shape=(301, 8))
    for name in TRITON_VARIANTS:
        got = kernels.get("rmsnorm", name, impl="triton")(x, w, EPS, r)
        want = kernels.get("rmsnorm", name, impl="torch")(x, w, EPS, r)
        assert torch.equal(got[1], want[1])
        assert torch.allclose(got[0], want[0], rtol=4 * ulp(torch.float32), atol=1e-7), name


@pytest.mark.parametrize("name", TRITON_VARIANTS)
def test_triton_float64_matches_torch(name):
    x, w, r = data(torch.float64, shape=(4, 24))
    y, new_r = kernels.get("rmsnorm", name, impl="triton")(x, w, EPS, r)
    y_t, new_r_t = kernels.get("rmsnorm", name, impl="torch")(x, w, EPS, r)
    assert y.dtype == y_t.dtype and torch.equal(new_r, new_r_t)
    assert torch.allclose(y, y_t, rtol=1e-6 if name != "reference" else 1e-13, atol=0)
    if name == "reference":
        assert torch.allclose(y, truth(x, w, EPS, r), rtol=1e-13, atol=0)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_non_contiguous_input_is_handled(variant):
    x, w, r = data(torch.float32, shape=(48, 6))
    xt, rt = x.T, r.T  # [6, 48] views with stride (1, 6)
    assert not xt.is_contiguous()
    w = torch.linspace(0.5, 1.5, 48)
    f = variant_fn("rmsnorm", variant)
    y, new_r = f(xt, w, EPS, rt)
    y_c, new_r_c = f(xt.contiguous(), w, EPS, rt.contiguous())
    # same values; torch may sum a strided row in another order, hence a few-ulp tolerance
    assert torch.equal(new_r, new_r_c)
    assert torch.allclose(y, y_c, rtol=4 * ulp(torch.float32), atol=1e-7)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_nan_propagates_to_its_row_only(variant):
    x, w, r = data(torch.float32, shape=(4, 32))
    x[1, 5] = float("nan")
    y, new_r = variant_fn("rmsnorm", variant)(x, w, EPS, r)
    assert torch.isnan(y[1]).all() and torch.isnan(new_r[1, 5])
    assert torch.isfinite(y[[0, 2, 3]]).all()


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_bad_inputs_raise_with_names_and_shapes(variant):
    f = variant_fn("rmsnorm", variant)
    x, w, r = data(torch.float32, shape=(4, 32))
    with pytest.raises(ValueError, match=r"x\[4, 32\].*weight\[31\]"):
        f(x, w[:31], EPS)
    with pytest.raises(ValueError, match=r"x\[4, 32\].*residual\[4, 16\]"):
        f(x, w, EPS, r[:, :16])
    for bad_eps in (0.0, -1e-6, float("nan")):
        with pytest.raises(ValueError, match="eps must be > 0"):
            f(x, w, bad_eps)
    with pytest.raises(TypeError, match=r"x\[4, 32\] int64"):
        f(torch.ones(4, 32, dtype=torch.int64), w, EPS)
    with pytest.raises(ValueError, match=r"weight\[4, 32\].*\[H\]"):
        f(x, x, EPS)
