"""PrepackedLinear: F.linear's bits on CPU bf16 weights packed once, refreshed when they change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minirl import Engine, SamplingParams
from minirl.engine import prepack
from minirl.engine.prepack import PrepackedLinear

# [O, K]: smollm2-135m's qkv / o / gate_up / down, gemma3-270m's, the zoo's tiny ones, and odd sizes
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (1536, 640), (640, 1024), (4096, 640), (640, 2048),
          (192, 64), (64, 64), (256, 64), (64, 128), (8192, 96), (100, 37), (1, 7)]
ROWS = [1, 2, 3, 7, 16, 31, 32, 33, 64, 100, 300, 1000]
PARAMS = SamplingParams(n=2, max_new_tokens=6, seed=8, ignore_eos=True)
needs_onednn_bf16 = pytest.mark.skipif(not prepack.available(), reason="this CPU's torch has no oneDNN bf16 GEMM")


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


@needs_onednn_bf16
@pytest.mark.parametrize("o,k", SHAPES)
def test_packed_product_is_f_linear_bitwise(o, k):
    linear, w, bias = PrepackedLinear(), _bf16(o, k, seed=o), _bf16(o, seed=k)
    for n in ROWS:
        x = _bf16(n, k, seed=n)
        assert torch.equal(linear(x, w), F.linear(x, w)), (o, k, n)
        assert torch.equal(linear(x, w, bias), F.linear(x, w, bias)), (o, k, n, "bias")
    assert len(linear._packed) == 1  # one packed copy, reused by every row count


@needs_onednn_bf16
def test_an_in_place_write_repacks_and_clear_drops_every_copy():
    linear, w, x = PrepackedLinear(), _bf16(256, 64, seed=0), _bf16(8, 64, seed=1)
    before = linear(x, w)
    w.mul_(1.5)  # a notebook's perturbation: the version counter moves
    assert torch.equal(linear(x, w), F.linear(x, w))
    assert not torch.equal(linear(x, w), before)
    linear.clear()
    assert len(linear._packed) == 0


def test_what_it_does_not_pack_is_plain_f_linear():
    linear = PrepackedLinear()
    w32, x32 = torch.randn(64, 32), torch.randn(4, 32)
    w_grad = _bf16(64, 32, seed=0).requires_grad_()
    view = _bf16(64, 64, seed=1)[:, :32]  # a tensor-parallel slice
    x = _bf16(4, 32, seed=2)
    assert torch.equal(linear(x32, w32), F.linear(x32, w32))
    out = linear(x, w_grad)
    assert out.requires_grad and torch.equal(out, F.linear(x, w_grad))  # autograd keeps F.linear
    assert torch.equal(linear(x, view), F.linear(x, view))
    assert len(linear._packed) == 0


def test_unavailable_onednn_means_no_packing(monkeypatch):
    monkeypatch.setattr(prepack, "available", lambda: False)
    linear, w, x = PrepackedLinear(), _bf16(64, 32, seed=0), _bf16(4, 32, seed=1)
    assert torch.equal(linear(x, w), F.linear(x, w)) and len(linear._packed) == 0


@needs_onednn_bf16
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe"])
def test_bf16_engine_is_unchanged_by_packing_and_follows_a_weight_sync(name, zoo, prompts, monkeypatch):
    """The engine's bf16 rollouts and scores are the same bits with and without packing, and
    after ``load_weights`` (an in-place copy) it decodes with the new weights, not stale packs."""
    import transformers

    eng = Engine.from_pretrained(zoo(name), dtype=torch.bfloat16)
    packed = eng.generate(prompts, PARAMS)
    assert len(eng.model.linear._packed) > 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(zoo(name), dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(1.02)  # stands in for the model after an RL step
    eng.load_weights(hf)
    synced, synced_scores = eng.generate(prompts, PARAMS), eng.score(prompts)
    monkeypatch.setattr(prepack, "available", lambda: False)
    plain = Engine.from_pretrained(zoo(name), dtype=torch.bfloat16)
    assert _same(plain.generate(prompts, PARAMS), packed)
    plain.load_weights(hf)
    assert _same(plain.generate(prompts, PARAMS), synced)
    assert not _same(synced, packed)
    assert all(torch.equal(a, b) for a, b in zip(plain.score(prompts), synced_scores))


def _same(a, b) -> bool:
    return all(x.token_ids == y.token_ids and torch.equal(x.logprobs, y.logprobs) for x, y in zip(a, b))
