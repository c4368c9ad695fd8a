"""RoPE variants against an independent float64 rotation (complex multiply), transformers,
and each other."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.kernels_testutil import impl_cases, max_ulps, mean_abs_err, ulp
from tests.kernels.kernels_testutil import variant as variant_fn

import kernels
from kernels import rope as rope_mod

TORCH_VARIANTS = ["reference", "hf", "cached_table", "fp32_compute"]
ALL_VARIANTS = impl_cases("rope", TORCH_VARIANTS)  # with "fp32_compute/triton", "hf/triton"
TRITON_VARIANTS = [v for v in TORCH_VARIANTS if "triton" in kernels.impls("rope", v)]
THETA = 10_000.0


def truth(x, positions, theta, rotary_dim, style):
    """float64 RoPE as a complex multiplication, written independently of kernels.rope."""
    x = x.double()
    j = torch.arange(rotary_dim // 2, dtype=torch.float64)
    ang = positions.double()[:, None] * theta ** (-2 * j / rotary_dim)  # [N, R/2]
    turn = torch.polar(torch.ones_like(ang), ang)[:, None, :]  # [N, 1, R/2]
    if style == "neox":
        pairs = torch.complex(x[..., : rotary_dim // 2], x[..., rotary_dim // 2 : rotary_dim]) * turn
        rot = torch.cat((pairs.real, pairs.imag), -1)
    else:
        pairs = torch.complex(x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]) * turn
        rot = torch.stack((pairs.real, pairs.imag), -1).flatten(-2)
    return torch.cat((rot, x[..., rotary_dim:]), -1)


def data(dtype, n=7, heads=3, head_dim=16, seed=0, max_pos=4000):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, heads, head_dim, generator=g).to(dtype)
    positions = torch.randint(0, max_pos, (n,), generator=g)
    return x, positions


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_reference_is_float64_truth(style, rotary_dim):
    x, pos = data(torch.float64)
    got = kernels.get("rope", "reference")(x, pos, theta=THETA, rotary_dim=rotary_dim, style=style)
    assert torch.allclose(got, truth(x, pos, THETA, rotary_dim, style), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_hf_is_bit_exact_vs_transformers(dtype, rotary_dim):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    x, pos = data(dtype)
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=rotary_dim, rope_theta=THETA)
    cos, sin = LlamaRotaryEmbedding(config)(x, pos[None])  # [1, N, R] in x.dtype
    q = x[None, ..., :rotary_dim]  # [1, N, heads, R]; partial rotary: HF models split like this
    q_rot, _ = apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=2)
    expected = torch.cat((q_rot[0], x[..., rotary_dim:]), -1)
    got = kernels.get("rope", "hf")(x, pos, theta=THETA, rotary_dim=rotary_dim, style="neox")
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hf_gptj_style_is_bit_exact_vs_transformers_gptj(dtype):
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    x, pos = data(dtype)
    sincos = create_sinusoidal_positions(4000, 8)[pos].to(dtype)  # GPT-J: fp32 table cast to x.dtype
    sin, cos = sincos.chunk(2, dim=-1)
    rot = apply_rotary_pos_emb(x[None, ..., :8], sin[None], cos[None])[0]
    got = kernels.get("rope", "hf")(x, pos, theta=10_000.0, rotary_dim=8, style="gptj")
    assert torch.equal(got, torch.cat((rot, x[..., 8:]), -1))


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_partial_rotary_passes_tail_through_and_rotates_head(variant, style):
    x, pos = data(torch.float32, head_dim=24, max_pos=256)  # fp32 angles exact to ~2e-5 rad here
    got = variant_fn("rope", variant)(x, pos, theta=THETA, rotary_dim=16, style=style)
    assert torch.equal(got[..., 16:], x[..., 16:])
    assert torch.allclose(got, truth(x, pos, THETA, 16, style).float(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_decode_offsets_equal_prefill_rows(variant):
    """One token at an arbitrary position (decode) gets exactly its prefill row."""
    x, _ = data(torch.bfloat16, n=12)
    prefill_pos = torch.arange(100, 112)
    full = variant_fn("rope", variant)(x, prefill_pos, theta=THETA, rotary_dim=16)
    for i in (0, 5, 11):
        one = variant_fn("rope", variant)(x[i : i + 1], prefill_pos[i : i + 1], theta=THETA, rotary_dim=16)
        assert torch.equal(one[0], full[i])


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_error_ordering_in_bf16(style):
    """Expected direction: one rounding (fp32_compute) beats hf's bf16 cos/sin and bf16 products;
    the vLLM default table (bf16) equals hf bit for bit; an fp32 table (SGLang) matches fp32."""
    x, pos = data(torch.bfloat16, n=64)
    t = truth(x, pos, THETA, 16, style)
    run = lambda v, **kw: kernels.get("rope", v)(x, pos, theta=THETA, rotary_dim=16, style=style, **kw)  # noqa: E731
    err = {v: mean_abs_err(run(v), t) for v in TORCH_VARIANTS}
    assert err["fp32_compute"] == err["reference"]
    assert err["fp32_compute"] < 0.8 * err["hf"]
    assert torch.equal(run("cached_table"), run("hf"))
    assert mean_abs_err(run("cached_table", cache_dtype=torch.float32), t) < 0.8 * err["hf"]


def test_fp32_angles_drift_at_long_positions():
    """fp32 angles carry ~position * 6e-8 rad of error: visible against float64 at 1M tokens."""
    x, _ = data(torch.float64, n=4)
    pos = torch.tensor([3, 1_000_003, 1_500_001, 2_000_003])
    err = (kernels.get("rope", "fp32_compute")(x, pos, theta=THETA, rotary_dim=16) - truth(x, pos, THETA, 16, "neox")).abs()
    assert float(err[0].max()) < 1e-6 < float(err[1:].max())


def test_cached_table_is_cached_and_grows_on_demand():
    rope_mod._TABLES.clear()
    x, _ = data(torch.float32, n=2)
    f = kernels.get("rope", "cached_table")
    f(x, torch.tensor([1, 2]), theta=THETA, rotary_dim=16)
    key = (THETA, 16, torch.float32, torch.device("cpu"))
    small = rope_mod._TABLES[key]
    f(x, torch.tensor([3, 4]), theta=THETA, rotary_dim=16)
    assert rope_mod._TABLES[key] is small  # reused
    f(x, torch.tensor([5, small.shape[0] + 10]), theta=THETA, rotary_dim=16)
    grown = rope_mod._TABLES[key]
    assert grown.shape[0] > small.shape[0] + 10
    assert torch.equal(grown[: small.shape[0]], small)
    f(x, torch.tensor([1, 2]), theta=THETA, rotary_dim=16, cache_dtype=torch.bfloat16)
    assert rope_mod._TABLES[(THETA, 16, torch.bfloat16, torch.device("cpu"))].dtype == torch.bfloat16


@pytest.mark.parametrize("name", TRITON_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_triton_matches_torch(name, dtype, style):
    x, pos = data(dtype, n=5, heads=3, head_dim=20)  # head count and rotary half not powers of 2
    got = kernels.get("rope", name, impl="triton")(x, pos, theta=THETA, rotary_dim=12, style=style)
    want = kernels.get("rope", name, impl="torch")(x, pos, theta=THETA, rotary_dim=12, style=style)
    assert got.dtype == dtype and torch.equal(got[..., 12:], x[..., 12:])
    if dtype == torch.float32:  # same fp32 angles; sin/cos implementations differ by ~1 ulp
        assert torch.allclose(got, want, rtol=0, atol=8 * ulp(torch.float32) * float(x.abs().max()))
    elif name == "fp32_compute":  # one rounding of nearly equal fp32 values
        assert max_ulps(got, want, dtype) <= 1
    else:  # hf rounds cos/sin to bf16 first: a 1-ulp flip there moves a product by an ulp, the sum by 2
        assert max_ulps(got, want, dtype, floor_rel=1e-3) <= 2


def fp32_angle_truth(x, positions, theta, rotary_dim, style):
    """float64 rotation by the *fp32* angles ``float32(position) * float32(inv_freq)`` — what the
    ``fp32_compute`` recipe defines — with cos/sin and the products in float64."""
    j = torch.arange(0, rotary_dim, 2, dtype=torch.float32)
    freq = 1.0 / theta ** (j / rotary_dim)  # fp32, as every fp32 engine computes it
    ang = (positions.float()[:, None] * freq[None, :]).double()  # [N, R/2], exact fp32 values
    x = x.double()
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    half = rotary_dim // 2
    x1, x2 = (x[..., :half], x[..., half:rotary_dim]) if style == "neox" else (x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2])
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    rot = torch.cat((o1, o2), -1) if style == "neox" else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((rot, x[..., rotary_dim:]), -1)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_large_positions_both_impls_match_float64_of_fp32_angles(style, impl):
    """The H100 failure of ``test_rope_triton_compiled``: at positions up to 32768 with theta 1e6
    the fp32 angles reach 3e4 rad, where the GPU's approximate sin/cos lose ~angle * 2**-22. The
    reference here is float64 sin/cos *of the same fp32 angles*, so an implementation may not hide
    behind the shared fp32-angle error: both must round the float64 result to within one ulp.
    The kernel reduces the angle to [-pi, pi] in float64 before sin/cos (kernels/triton_rope.py);
    the CPU interpreter checks the reduction keeps the numbers, the gpu test the card."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 2, 32, generator=g)
    pos = torch.cat([torch.tensor([0, 1, 32767, 32768, 1 << 20]), torch.randint(0, 1 << 21, (11,), generator=g)])
    f = kernels.get("rope", "fp32_compute", impl=impl)
    for dtype in (torch.bfloat16, torch.float32):
        xd = x.to(dtype)
        want = fp32_angle_truth(xd, pos, 1e6, 32, style)
        got = f(xd, pos, theta=1e6, rotary_dim=32, style=style)
        if dtype == torch.bfloat16:
            assert max_ulps(got, want, dtype, floor_rel=1e-3) <= 1
        else:  # fp32 rounding of cos/sin (+ the reduced angle in the kernel): ~1e-7 absolute
            assert float((got.double() - want).abs().max()) <= 4e-7 * float(x.abs().max())
    exact = truth(x.double(), pos, 1e6, 32, style)  # exact angles: the fp32-angle drift both share
    assert float((fp32_angle_truth(x, pos, 1e6, 32, style) - exact).abs().max()) > 1e-4


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_non_contiguous_input_is_handled(variant):
    x, pos = data(torch.float32, n=4, heads=6, head_dim=16)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, heads-major strides
    assert not xt.is_contiguous()
    f = variant_fn("rope", variant)
    assert torch.equal(f(xt, pos, theta=THETA, rotary_dim=16), f(x, pos, theta=THETA, rotary_dim=16))


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_nan_propagates_to_its_pair_only(variant):
    x, pos = data(torch.float32, n=3, heads=2, head_dim=8)
    x[1, 0, 0] = float("nan")
    y = variant_fn("rope", variant)(x, pos, theta=THETA, rotary_dim=8, style="neox")
    assert torch.isnan(y[1, 0, 0]) and torch.isnan(y[1, 0, 4])  # 0 and 4 form a neox pair
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[1, 1]).all()


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_bad_inputs_raise_with_names_and_shapes(variant):
    f = variant_fn("rope", variant)
    x, pos = data(torch.float32, n=4)
    with pytest.raises(ValueError, match=r"x\[4, 3, 16\].*positions\[3\]"):
        f(x, pos[:3], theta=THETA, rotary_dim=16)
    with pytest.raises(TypeError, match=r"positions\[4\] float32"):
        f(x, pos.float(), theta=THETA, rotary_dim=16)
    with pytest.raises(ValueError, match=r"x\[4, 48\].*\[N, heads, head_dim\]"):
        f(x.reshape(4, 48), pos, theta=THETA, rotary_dim=16)
    for rd in (7, 18, 0):
        with pytest.raises(ValueError, match="rotary_dim"):
            f(x, pos, theta=THETA, rotary_dim=rd)
    with pytest.raises(ValueError, match="theta must be > 0"):
        f(x, pos, theta=0.0, rotary_dim=16)
    with pytest.raises(ValueError, match="style"):
        f(x, pos, theta=THETA, rotary_dim=16, style="llama")


def test_cached_table_rejects_negative_positions():
    x, _ = data(torch.float32, n=2)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        kernels.get("rope", "cached_table")(x, torch.tensor([0, -1]), theta=THETA, rotary_dim=16)
