"""Hostile inputs, round 4 (issue 48), quantizers: a Q4_0 block whose fp16 scale overflows keeps
its full-precision values and is named (ggml's own Q4_0 gives inf and NaN there), and an empty
matrix comes back as it is in every format."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from minirl.engine.quantize import FORMATS, Q4_SCALE_LIMIT, fake_quantize


def test_Q_int4_1e6(caplog):
    torch.manual_seed(0)
    w = torch.randn(4, 64) * 0.02
    w[0, 0] = 1e6
    with caplog.at_level(logging.WARNING, logger="minirl.engine.quantize"):
        q = fake_quantize(w, "int4", "L0.qkv")
    assert torch.isfinite(q).all()
    assert torch.equal(q[0, :32], w[0, :32])  # the overflowing block: full precision
    assert not torch.equal(q[0, 32:], w[0, 32:])  # the other blocks are still rounded to 4 bits
    assert torch.equal(q[1:], fake_quantize(w[1:], "int4"))
    assert "1 of 8 blocks of L0.qkv (shape (4, 64)) stay in full precision" in caplog.text
    assert "fp16 scale" in caplog.text


def test_Q_int4_scale_limit_is_where_fp16_overflows(caplog):
    """Just below the limit the block is quantized (finite scale 65504), at it the block stays."""
    below, at = torch.full((2, 32), 0.01), torch.full((2, 32), 0.01)
    below[:, 0] = float(np.nextafter(np.float32(Q4_SCALE_LIMIT), np.float32(0)))
    at[:, 0] = Q4_SCALE_LIMIT
    with caplog.at_level(logging.WARNING, logger="minirl.engine.quantize"):
        qb = fake_quantize(below, "int4")
        assert not caplog.text
        qa = fake_quantize(at, "int4")
    assert torch.isfinite(qb).all() and not torch.equal(qb, below)
    assert torch.equal(qa, at) and "2 of 2 blocks" in caplog.text


def test_Q_int4_overflow_is_ggml_behaviour():
    """The reference Q4_0 (the ``gguf`` package) gives inf and NaN on the same block: why it is kept."""
    gq = pytest.importorskip("gguf.quants", reason="the gguf package is the Q4_0 reference")
    from gguf import GGMLQuantizationType

    w = np.full((1, 32), 0.01, np.float32)
    w[0, 0] = 1e6
    with np.errstate(all="ignore"):
        ref = gq.dequantize(gq.quantize(w, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
    assert not np.isfinite(ref).any()
    assert torch.equal(fake_quantize(torch.from_numpy(w), "int4"), torch.from_numpy(w))


def empty_matrices_come_back(fmt: str) -> None:
    for shape in ((0, 64), (3, 0, 64), (4, 0)):
        out = fake_quantize(torch.randn(shape, dtype=torch.bfloat16), fmt)
        assert out.shape == shape and out.dtype == torch.float32


def test_Q_int4_empty():
    empty_matrices_come_back("int4")


def test_Q_fp8_e4m3_tensor_empty():
    empty_matrices_come_back("fp8_e4m3_tensor")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in ("int4", "fp8_e4m3_tensor")])
def test_Q_empty_other_formats(fmt):
    empty_matrices_come_back(fmt)
