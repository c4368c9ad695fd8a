"""Weight quantizers of the rollout engine: hand-computed rows/blocks, an independent float64
transcription of each format's definition, and the round-trip error each format guarantees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minirl.engine.quantize import FORMATS, fake_quantize


def _weights() -> list[torch.Tensor]:
    """A dense matrix with outlier rows and an MoE expert stack [E, out, in]; 'in' a multiple of 32."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(24, 96, generator=g) * 0.05
    dense[3, 7] = 1.5  # an outlier sets its row's scale
    dense[5] = 0.0  # an all-zero row must survive every format
    return [dense, torch.randn(3, 8, 64, generator=g) * 0.02]


# ---------------------------------------------------------------------- float64 references
def _ref_fp8_e4m3(w: np.ndarray) -> np.ndarray:
    """Per-row scale amax/448; e4m3 has 3 mantissa bits and a smallest normal 2**-6, so the
    spacing is 2**(floor(log2|y|) - 3), never below 2**-9 (subnormals); ties to even."""
    amax = np.abs(w).max(-1, keepdims=True)
    scale = np.where(amax > 0, amax / 448.0, 1.0)
    y = w / scale
    step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** -6))) - 3)
    return np.round(y / step) * step * scale


def _ref_int8(w: np.ndarray) -> np.ndarray:
    amax = np.abs(w).max(-1, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    return np.clip(np.round(w / scale), -127, 127) * scale


def _ref_q4_0(w: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q4_0_ref + dequantize_row_q4_0, block by block."""
    out = np.empty_like(w)
    flat_in, flat_out = w.reshape(-1, 32), out.reshape(-1, 32)
    for block, dst in zip(flat_in, flat_out):
        m = block[np.argmax(np.abs(block))]  # signed value of largest magnitude, first one wins
        d = m / -8.0
        inv = 1.0 / d if d else 0.0
        d16 = float(np.float16(d))  # the block stores d as fp16
        dst[:] = [(min(15, int(x * inv + 8.5)) - 8) * d16 for x in block]
    return out


REFERENCES = {"fp8_e4m3": _ref_fp8_e4m3, "int8": _ref_int8, "int4": _ref_q4_0}


@pytest.mark.parametrize("fmt", sorted(REFERENCES))
def test_matches_the_float64_transcription(fmt):
    for w in _weights():
        ours = fake_quantize(w, fmt).double().numpy()
        ref = REFERENCES[fmt](w.double().numpy())
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-9)
        assert (ours != w.double().numpy()).any(), "quantization changed nothing"


# ---------------------------------------------------------------------- hand-computed cases
def test_q4_0_block_by_hand():
    """Largest magnitude -4: d = -4 / -8 = 0.5, 1/d = 2, q = trunc(2x + 8.5), value (q - 8) * 0.5.
    The largest value is exact; the other side saturates at q = 15, i.e. 7 * 0.5 = 3.5."""
    x = torch.zeros(1, 32)
    x[0, :7] = torch.tensor([-4.0, 2.0, 1.0, 0.3, 0.2, -0.3, 3.9])
    # q:                      0    12    10    9    8    7     15 (16.3 clamped)
    expect = torch.zeros(1, 32)
    expect[0, :7] = torch.tensor([-4.0, 2.0, 1.0, 0.5, 0.0, -0.5, 3.5])
    assert torch.equal(fake_quantize(x, "int4"), expect)
    # A positive maximum flips the sign of d: now the negative side saturates.
    assert torch.equal(fake_quantize(-x, "int4")[0, :7], torch.tensor([4.0, -2.0, -1.0, -0.5, 0.0, 0.5, -3.5]))


def test_q4_0_scale_is_stored_in_fp16():
    """m = -8 (1 + 2**-12): d = 1 + 2**-12 rounds to 1.0 in fp16, so m comes back as -8, not m."""
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, 0] = -8 * (1 + 2 ** -12)
    assert fake_quantize(x, "int4")[0, 0].item() == -8.0


def test_int8_row_by_hand():
    """amax 127 * 2**-6, so scale = 2**-6 exactly; 1.5 and 2.5 quanta both round to 2 (half to even)."""
    s = 2.0 ** -6
    row = torch.tensor([[127 * s, -0.5, 1.5 * s, 2.5 * s, 0.0]])
    assert torch.equal(fake_quantize(row, "int8"), torch.tensor([[127 * s, -32 * s, 2 * s, 2 * s, 0.0]]))


def test_fp8_e4m3_row_by_hand():
    """amax 448 gives scale 1. 1.0625 is halfway between 1 and 1.125 and goes to the even mantissa
    (1.0); 1.1875 halfway between 1.125 and 1.25 goes to 1.25; 0.001 is subnormal, step 2**-9."""
    row = torch.tensor([[448.0, 1.0625, 1.1875, 0.001, -300.0]])
    # -300 in [256, 512): step 32, 300 / 32 = 9.375 -> 9 -> 288
    assert torch.equal(fake_quantize(row, "fp8_e4m3"), torch.tensor([[448.0, 1.0, 1.25, 2.0 ** -9, -288.0]]))


# ---------------------------------------------------------------------- round-trip error bounds
def test_round_trip_error_bounds():
    for w in _weights():
        w = w.double()
        amax = w.abs().amax(-1, keepdim=True)
        err8 = (fake_quantize(w, "int8").double() - w).abs()
        assert (err8 <= amax / 127 / 2 * (1 + 1e-6)).all()  # half a quantum per row
        errf = (fake_quantize(w, "fp8_e4m3").double() - w).abs()
        bound = torch.maximum(w.abs() * 2.0 ** -4, amax / 448 * 2.0 ** -10)  # half an ulp: 3 mantissa bits
        assert (errf <= bound * (1 + 1e-6)).all()
        tensor_amax = w.abs().amax((-2, -1), keepdim=True)  # one scale per matrix: a coarser subnormal step
        errt = (fake_quantize(w, "fp8_e4m3_tensor").double() - w).abs()
        assert (errt <= torch.maximum(w.abs() * 2.0 ** -4, tensor_amax / 448 * 2.0 ** -10) * (1 + 1e-6)).all()
        blocks = w.reshape(*w.shape[:-1], -1, 32)
        d = (blocks.abs().amax(-1, keepdim=True) / 8).expand_as(blocks).reshape(w.shape)
        err4 = (fake_quantize(w, "int4").double() - w).abs()
        assert (err4 <= d * (1 + 2 ** -8)).all()  # |d| on the saturated side (+ fp16 scale rounding)


def test_none_is_the_identity_and_zero_rows_stay_zero():
    w = _weights()[0]
    assert torch.equal(fake_quantize(w, "none"), w)
    for fmt in FORMATS:
        assert torch.equal(fake_quantize(w, fmt)[5], torch.zeros(96))


@pytest.mark.parametrize("w, fmt, message", [
    (torch.zeros(4, 48), "int4",
     r"L0.o \(shape \(4, 48\)\) has 48 input features, not a multiple of int4's block of 32; use weights='int8'"),
    (torch.zeros(4, 32), "int3", r"weights='int3'.*valid: \['none', 'fp8_e4m3', 'int8', 'int4', 'fp8_e4m3_tensor'\]"),
    (torch.zeros(32), "int8", r"L0.o: .*needs a matrix; got shape \(32,\)"),
])
def test_bad_input_names_the_tensor_and_the_fix(w, fmt, message):
    with pytest.raises(ValueError, match=message):
        fake_quantize(w, fmt, "L0.o")
