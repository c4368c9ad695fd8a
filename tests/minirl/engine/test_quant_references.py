"""minirl's quantizers against references nobody here wrote, bit for bit: the ``gguf`` package's
Q4_0 (ggml's own numpy port) for int4, and float64 transcriptions of the arithmetic vLLM's
kernels do (fp32 scale, fp32 quotient, round to nearest even) for int8 / fp8, on hand-made ties
and on the real smollm2-135m weights.

Why the fp32 steps are part of the format: at a tie the *rounded* quotient decides the
direction. vLLM (``scaled_fp8_conversion``, ``quantize_in_place_and_get_scales``) and
compressed-tensors round ``fl32(w / s)``; rounding the exact quotient instead moves thousands
of smollm2-135m elements by one step (``benchmarks/quant_rounding.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minirl.engine.quantize import FP8_MAX, fake_quantize, fake_quantize_activations, q4_0_blocks

gguf_quants = pytest.importorskip("gguf.quants", reason="the gguf package is the Q4_0 reference")
from gguf import GGMLQuantizationType  # noqa: E402  (after the importorskip that guards it)


def f32(a: np.ndarray | float) -> np.ndarray:
    """Round float64 values to fp32 and back: the result of one fp32 operation whose exact value
    is ``a`` (float64 holds the exact product/quotient of two fp32 operands closely enough that
    this double rounding equals fp32's own single rounding)."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def e4m3_rne(y: np.ndarray) -> np.ndarray:
    """float8 e4m3fn of ``y`` (|y| <= 448), nearest even: 3 mantissa bits, so the spacing is
    2**(floor(log2|y|) - 3), never below 2**-9 (subnormals); y / step is exact (a power of 2)."""
    step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** -6))) - 3)
    return np.round(y / step) * step


# ---------------------------------------------------------------------- float64 transcriptions
def ref_int8(w: np.ndarray) -> np.ndarray:
    """vLLM ``quantize_in_place_and_get_scales``: s = amax / 127, w / s, round, clamp, all fp32."""
    amax = np.abs(w).max(-1, keepdims=True)
    s = np.where(amax > 0, f32(amax / 127.0), 1.0)
    return f32(np.clip(np.round(f32(w / s)), -127, 127) * s)


def ref_fp8_channel(w: np.ndarray) -> np.ndarray:
    """compressed-tensors FP8 weights: per-row s = amax / 448, e4m3(clamp(w / s)), all fp32."""
    amax = np.abs(w).max(-1, keepdims=True)
    s = np.where(amax > 0, f32(amax / FP8_MAX), 1.0)
    return f32(e4m3_rne(np.clip(f32(w / s), -FP8_MAX, FP8_MAX)) * s)


def ref_fp8_tensor(w: np.ndarray) -> np.ndarray:
    """vLLM ``dynamic_scaled_fp8_quant`` of a weight matrix: one s = amax / 448, then the kernel's
    ``x * (1 / s)`` (it inverts the scale once), e4m3, all fp32."""
    amax = np.abs(w).max((-2, -1), keepdims=True)
    s = np.where(amax > 0, f32(amax / FP8_MAX), 1.0)
    return f32(e4m3_rne(np.clip(f32(w * f32(1.0 / s)), -FP8_MAX, FP8_MAX)) * s)


def ref_fp8_per_token(x: np.ndarray) -> np.ndarray:
    """vLLM ``dynamic_per_token_scaled_fp8_quant``: s = max(amax / 448, 1 / (448 * 512)) per
    token, e4m3(clamp(x / s)) (this kernel divides), dequantized q * s, all fp32."""
    amax = np.abs(x).max(-1, keepdims=True)
    s = np.maximum(f32(amax / FP8_MAX), f32(1.0 / (FP8_MAX * 512.0)))
    return f32(e4m3_rne(np.clip(f32(x / s), -FP8_MAX, FP8_MAX)) * s)


WEIGHT_REFS = {"int8": ref_int8, "fp8_e4m3": ref_fp8_channel, "fp8_e4m3_tensor": ref_fp8_tensor}


def _ggml_q4_0_bytes(w: torch.Tensor) -> np.ndarray:
    """Our Q4_0 codes laid out as ggml's ``block_q4_0``: fp16 ``d``, then 16 bytes holding code
    j in the low nibble and code j + 16 in the high nibble."""
    d, q = q4_0_blocks(w.float())
    q = q.numpy()
    packed = q[..., :16] | (q[..., 16:] << 4)
    blocks = np.concatenate([d.numpy().view(np.uint8), packed], axis=-1)  # [..., in/32, 18]
    return blocks.reshape(*w.shape[:-1], -1)


def _check_q4_0_against_gguf(w: torch.Tensor) -> None:
    ref = gguf_quants.quantize(w.float().numpy(), GGMLQuantizationType.Q4_0)
    np.testing.assert_array_equal(_ggml_q4_0_bytes(w), ref)
    decoded = gguf_quants.dequantize(ref, GGMLQuantizationType.Q4_0)
    assert np.array_equal(fake_quantize(w, "int4").numpy(), decoded)


# ---------------------------------------------------------------------- int4 = gguf Q4_0
def _q4_edge_blocks() -> torch.Tensor:
    """One block per edge case ggml's rounding has to get right."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(12, 32, generator=g)
    rows[0] = 0.0  # all zero: d = 0, 1/d taken as 0, every code 8
    rows[1] = -rows[1].abs()
    rows[1, 5] = -3.0  # negative maximum: d > 0, the positive side saturates at 15
    rows[2] = rows[2].abs()
    rows[2, 9] = 3.0  # positive maximum: d < 0
    rows[3, 0], rows[3, 1] = 2.5, -2.5  # equal magnitudes, opposite signs: the first one wins
    rows[4, 0], rows[4, 1] = -2.5, 2.5
    d = -4.0 / -8.0  # rows[5]: max -4, d = 0.5, 1/d = 2: w * 2 + 8.5 lands exactly on integers
    rows[5] = torch.arange(-16, 16) * 0.25
    rows[5, 0] = -4.0
    rows[6] = rows[6] * 1e-6  # d subnormal in fp16
    rows[7] = rows[7] * 1e4  # |d| > 1000
    rows[8, :] = 1.0 / 3.0  # constant block, odd value
    rows[8, 0] = -1.0 / 3.0
    rows[9] = torch.tensor([(k + 0.5) * d for k in range(-8, 8)] * 2)  # exact half steps: trunc, not round
    rows[9, 0] = -4.0
    rows[10] = torch.tensor([1.7, -0.1, 0.0, -0.0] * 8)
    rows[11] = torch.tensor([float(k % 7) - 3.0 for k in range(32)]) / 7.0  # odd sevenths
    return rows


def test_int4_is_gguf_q4_0_bit_for_bit_on_edge_blocks():
    _check_q4_0_against_gguf(_q4_edge_blocks())


def test_int4_is_gguf_q4_0_bit_for_bit_on_random_stacks():
    g = torch.Generator().manual_seed(4)
    _check_q4_0_against_gguf(torch.randn(3, 16, 96, generator=g) * 0.05)  # an expert stack [E, out, in]


# ---------------------------------------------------------------------- int8 / fp8: hand-made ties
def _fp32_ties(scale_of: float, midpoints: list[float], multiply: bool) -> list[tuple[float, float]]:
    """fp32 weights whose fp32 quotient (``w / s`` or ``w * fl32(1 / s)``) is exactly a midpoint
    ``m`` while the exact quotient is not: (w, m) pairs. Found by walking fp32 neighbours of
    ``m * s``; ``s`` = fl32(``scale_of``)."""
    s = np.float32(scale_of)
    inv = np.float32(1.0) / s
    found = []
    for m in midpoints:
        w = np.float32(m * float(s))
        for _ in range(8):
            w = np.nextafter(w, np.float32(np.inf))
        for _ in range(16):
            w = np.nextafter(w, np.float32(-np.inf))
            q32 = w * inv if multiply else w / s  # numpy float32 arithmetic: one fp32 rounding
            exact = float(w) * float(inv) if multiply else float(w) / float(s)
            if float(q32) == m and exact != m:
                found.append((float(w), m))
    return found


E4M3_MIDPOINTS = [2.0 ** e * (1 + (2 * j + 1) / 16) * sign for e in range(-6, 8) for j in range(8) for sign in (1, -1)
                  if 2.0 ** e * (1 + (2 * j + 1) / 16) < FP8_MAX]


@pytest.mark.parametrize("fmt, qmax, midpoints, multiply, rne", [
    ("int8", 127.0, [k + 0.5 for k in range(-120, 120)], False, np.round),
    ("fp8_e4m3", FP8_MAX, E4M3_MIDPOINTS, False, e4m3_rne),
    ("fp8_e4m3_tensor", FP8_MAX, E4M3_MIDPOINTS, True, e4m3_rne),
])
def test_ties_round_the_fp32_quotient_to_even(fmt, qmax, midpoints, multiply, rne):
    """A row with amax 1 (s = fl32(1 / qmax)) and weights whose fp32 quotient is exactly halfway
    between two codes while their exact quotient is not: each goes to the even code of the fp32
    quotient, as vLLM's kernels do, and at least a few of them are where the exact quotient
    would round the other way (so this pins the choice, not just the grid)."""
    ties = _fp32_ties(1.0 / qmax, midpoints, multiply)
    assert len(ties) >= 10
    w = torch.tensor([[1.0] + [t for t, _ in ties]])
    got = fake_quantize(w, fmt).double().numpy()
    s = f32(1.0 / qmax)
    mids = np.array([m for _, m in ties])
    np.testing.assert_array_equal(got[0, 1:], f32(rne(mids) * s))
    np.testing.assert_array_equal(got, WEIGHT_REFS[fmt](w.double().numpy()))
    operand = f32(1.0 / s) if multiply else 1.0 / s
    exact = np.array([t for t, _ in ties]) * operand  # float64: the exact quotient's side of the tie
    assert (rne(exact) != rne(mids)).sum() >= 3


# ---------------------------------------------------------------------- the real checkpoint
@pytest.fixture(scope="module")
def smollm2_matrices(zoo) -> list[torch.Tensor]:
    """Four smollm2-135m matrices (a real model's outliers): first and last layer's q and down."""
    from minirl import read_safetensors

    w = read_safetensors(zoo("smollm2-135m"))
    return [w[f"model.layers.{i}.{m}.weight"].float() for i in (0, 29) for m in ("self_attn.q_proj", "mlp.down_proj")]


@pytest.mark.parametrize("fmt", sorted(WEIGHT_REFS))
def test_int8_and_fp8_match_the_float64_transcription_on_smollm2(smollm2_matrices, fmt):
    """Bit for bit on the real weights; an exact-quotient rounding would not be (int8: it moves
    elements, counted here so the test shows the choice is visible on a real model)."""
    for w in smollm2_matrices:
        np.testing.assert_array_equal(fake_quantize(w, fmt).double().numpy(), WEIGHT_REFS[fmt](w.double().numpy()))
    if fmt == "int8":
        moved = 0
        for w in smollm2_matrices:
            x = w.double().numpy()
            s = f32(np.abs(x).max(-1, keepdims=True) / 127.0)
            moved += int((np.round(x / s) != np.round(f32(x / s))).sum())
        assert moved > 0


def test_int4_is_gguf_q4_0_bit_for_bit_on_smollm2(smollm2_matrices):
    for w in smollm2_matrices:
        _check_q4_0_against_gguf(w)


# ---------------------------------------------------------------------- activations: per-token fp8
def test_fp8_activations_match_vllm_per_token_transcription():
    """Tokens with outliers, an all-zero token (vLLM's minimum scale keeps it finite: zeros),
    a tiny-amax token (the minimum scale binds), and e4m3 midpoints of the fp32 quotient; in
    fp32 bit for bit, in bf16 the same values rounded to bf16."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 64, generator=g)
    x[1, 3] = 40.0
    x[2] = 0.0
    x[3] = x[3] * 1e-7
    ties = _fp32_ties(1.0 / FP8_MAX, E4M3_MIDPOINTS[:62], multiply=False)
    x[4] = torch.tensor([1.0] + [t for t, _ in ties])[:64]
    ref = ref_fp8_per_token(x.double().numpy())
    got = fake_quantize_activations(x, "fp8")
    np.testing.assert_array_equal(got.double().numpy(), ref)
    assert torch.equal(got[2], torch.zeros(64)) and not torch.equal(got, x)
    xb = x.bfloat16()
    ref_b = torch.from_numpy(ref_fp8_per_token(xb.double().numpy())).float().bfloat16()
    assert torch.equal(fake_quantize_activations(xb, "fp8"), ref_b)
    assert fake_quantize_activations(x, "none") is x
    with pytest.raises(ValueError, match=r"activations='int8'.*valid: \['none', 'fp8'\]"):
        fake_quantize_activations(x, "int8")
