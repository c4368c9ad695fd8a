"""A fault planted in one op of minirl (fp32 engine against the fp32 trainer) is the op the
drill names, in the first layer (where the first divergence is): bf16 softmax, bf16 attention
scores, a RoPE table built in bf16, a bf16 router GEMM. All through the public ``aligntools.drill``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aligntools
import minirl.engine.attention as minirl_attention

EAGER = "minirl:aligned,attention=eager"  # transformers' math, in fp32: the ops pair one to one


def _planted_attend(softmax_dtype: torch.dtype, scores_dtype: torch.dtype):
    """minirl's eager attention with the softmax or the QK^T scores computed in another dtype."""

    def _attend(q, k, v, mask, *, causal, backend, scale, softcap=None):
        assert softcap is None, "the planted attention models a dense model without an attention soft-cap"
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q.to(scores_dtype), k.transpose(2, 3).to(scores_dtype)).to(q.dtype) * scale
        sq, sk = scores.shape[-2:]
        allowed = torch.ones(sq, sk, dtype=torch.bool).tril()
        scores = scores + torch.zeros(allowed.shape, dtype=scores.dtype).masked_fill(
            ~allowed, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores.to(softmax_dtype), dim=-1).to(q.dtype)
        return torch.matmul(probs, v).transpose(1, 2)

    return _attend


def test_bf16_softmax_is_named(moe, monkeypatch):
    monkeypatch.setattr(minirl_attention, "_attend", _planted_attend(torch.bfloat16, torch.float32))
    result = aligntools.drill(moe, "L0.attn_out", train="hf:float32,attn=eager", infer=EAGER)
    first = result.first
    assert (first.op, first.role, first.unpaired) == ("softmax", "attention", False), str(result)
    assert first.knob == "attention" and first.input_error < 1e-6 < first.limit < first.error
    row = result.table.loc[first.row]
    assert (row["dtype_train"], row["dtype_infer"]) == ("float32", "bfloat16")


def test_bf16_attention_scores_are_named(moe, monkeypatch):
    monkeypatch.setattr(minirl_attention, "_attend", _planted_attend(torch.float32, torch.bfloat16))
    result = aligntools.drill(moe, "L0.attn_out", train="hf:float32,attn=eager", infer=EAGER)
    first = result.first
    assert (first.op, first.role) == ("gemm", "attention"), str(result)
    assert result.table.loc[first.row, "dtype_infer"] == "bfloat16"
    assert result.table.loc[first.row, "shape_infer"] == "4x24x24"  # QK^T [heads, S, S], not the PV GEMM


def test_rope_table_built_in_bf16_is_named(moe):
    result = aligntools.drill(moe, "L0.attn_out", infer="minirl:aligned,rope=cached_table,rope_cache_dtype=bfloat16")
    first = result.first
    assert first.unpaired and first.role == "rope", str(result)  # RoPE on q and k together: no pairs
    assert first.knob == "rope, rope_cache_dtype"
    assert set(result.table.loc[result.table["jumps"], "role"]) == {"rope"}


def test_bf16_router_gemm_is_named(moe):
    result = aligntools.drill(moe, "L0.router_logits", infer="minirl:aligned,router_dtype=bfloat16")
    first = result.first
    assert (first.op, first.role, first.knob) == ("gemm", "router", "router_dtype"), str(result)
    assert result.table.loc[first.row, "dtype_infer"] == "bfloat16"
    assert "first divergent op gemm (router)" in str(result)


def test_aligned_engines_have_no_divergent_op(moe):
    result = aligntools.drill(moe, "L1.attn_out", train="hf:float32,attn=eager", infer=EAGER)
    assert result.first is None, str(result)
    paired = result.table.dropna(subset=["error"])
    assert len(paired) > 10 and (paired["error"] <= paired["limit"]).all()
    assert "no op jumps" in str(result)
