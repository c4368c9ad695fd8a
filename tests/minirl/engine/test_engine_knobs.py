"""Every knob is wired: moving one knob off ``aligned`` moves the numerics, and only a little."""

from __future__ import annotations

import pytest
import torch

from minirl import Knobs, SamplingParams

ALIGNED = Knobs.aligned()


def _mean_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return torch.cat([x - y for x, y in zip(a, b)]).abs().mean().item()


@pytest.fixture(scope="module")
def seqs(engine):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (7, 4)]
    outs = engine("tiny-qwen3-moe").generate(prompts, SamplingParams(max_new_tokens=10, seed=0, ignore_eos=True))
    return [o.prompt_ids + o.token_ids for o in outs]


@pytest.mark.parametrize("dtype, changes", [
    ("bfloat16", dict(rmsnorm="fp32_residual")),
    ("bfloat16", dict(rmsnorm="bf16_compute")),
    ("bfloat16", dict(rmsnorm_eps=1e-5)),
    ("bfloat16", dict(activation="fused_silu_mul")),
    ("bfloat16", dict(rope="cached_table", rope_cache_dtype="float32")),
    ("bfloat16", dict(attention="sdpa")),
    ("bfloat16", dict(lm_head_dtype="act")),
    ("bfloat16", dict(router_dtype="act")),
    ("bfloat16", dict(tp=2)),
    ("float32", dict(weight_dtype="bfloat16")),
])
def test_each_knob_moves_the_logprobs(engine, seqs, dtype, changes):
    base = engine("tiny-qwen3-moe", dtype, ALIGNED).score(seqs)
    moved = engine("tiny-qwen3-moe", dtype, ALIGNED.replace(**changes)).score(seqs)
    diff = _mean_diff(moved, base)
    print(f"\n{dtype} {changes}: mean |dlogprob| vs aligned = {diff:.3g}")
    assert 0 < diff < 0.1


def test_expert_sum_order(engine, seqs):
    """With top-2 the order of two additions cannot matter (IEEE addition commutes); what
    differs is where the routing weight is applied: in fp32 (fused MoE) or in the weight's
    dtype (transformers). With an fp32 router both are fp32, so the two settings coincide."""
    scores = {}
    for router in ("float32", "act"):
        for order in ("expert_id", "topk_slot"):
            knobs = ALIGNED.replace(router_dtype=router, expert_sum_order=order)
            scores[router, order] = engine("tiny-qwen3-moe", "bfloat16", knobs).score(seqs)
    assert _mean_diff(scores["float32", "expert_id"], scores["float32", "topk_slot"]) == 0
    assert 0 < _mean_diff(scores["act", "expert_id"], scores["act", "topk_slot"]) < 0.1


def test_kv_cache_dtype_moves_decode_but_not_prefill(engine, seqs):
    prompts = [s[:5] for s in seqs]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    fp32 = engine("tiny-qwen3-moe", "float32", ALIGNED)
    bf16_cache = engine("tiny-qwen3-moe", "float32", ALIGNED.replace(kv_cache_dtype="bfloat16"))
    assert all(torch.equal(a, b) for a, b in zip(fp32.score(seqs), bf16_cache.score(seqs)))
    a, b = fp32.generate(prompts, params), bf16_cache.generate(prompts, params)
    assert any(not torch.equal(x.logprobs, y.logprobs) for x, y in zip(a, b))


def test_tensor_parallel_emulation_is_exact_math(engine, seqs):
    """TP=k only re-associates the row-parallel sums: fp32 stays within rounding of TP=1."""
    tp1 = engine("tiny-qwen3-moe", "float32", ALIGNED).score(seqs)
    for tp in (2, 4):
        tpk = engine("tiny-qwen3-moe", "float32", ALIGNED.replace(tp=tp)).score(seqs)
        for a, b in zip(tpk, tp1):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_presets():
    assert Knobs.typical_inference() == Knobs()
    typical, aligned = Knobs.typical_inference().to_dict(), Knobs.aligned().to_dict()
    diff = {k for k in typical if typical[k] != aligned[k]}
    assert {"rmsnorm", "activation", "rope", "attention", "kv_cache_dtype", "lm_head_dtype", "router_dtype",
            "topk", "expert_sum_order", "batch_invariant"} <= set(diff)


def test_knob_types_are_checked_on_construction():
    with pytest.raises(TypeError, match="batch_invariant='no' must be bool"):
        Knobs(batch_invariant="no")
    with pytest.raises(TypeError, match="tp=2.0 must be int"):
        Knobs(tp=2.0)
    assert Knobs(rmsnorm_eps=1).rmsnorm_eps == 1.0  # an int where a float is asked is fine


def test_validate_is_the_one_place_knob_values_are_checked():
    with pytest.raises(ValueError, match="knob rmsnorm='nope' is not a kernels rmsnorm variant"):
        Knobs(rmsnorm="nope").validate()
    with pytest.raises(ValueError, match="rmsnorm_eps=-1.0 must be > 0"):
        Knobs(rmsnorm_eps=-1.0).validate()
    with pytest.raises(ValueError, match="unknown knob 'tpp'"):
        Knobs.parse_value("tpp", "2")
    assert Knobs.parse_value("batch_invariant", "off") is False and Knobs.parse_value("rmsnorm_eps", "none") is None


@pytest.mark.parametrize("preset", ["aligned", "typical"])
def test_share_prefill_matches_per_sample_prefill(engine, prompts, preset):
    """Prefilling each prompt once and copying its KV rows to its samples is exact when every
    request is computed alone (``aligned``: batch-invariant) and fp32-close when batched."""
    params = SamplingParams(n=3, max_new_tokens=6, seed=4, ignore_eos=True)
    knobs = Knobs.preset(preset)
    base = engine("tiny-qwen3-moe", "float32", knobs).generate(prompts, params)
    shared_engine = engine("tiny-qwen3-moe", "float32", knobs.replace(share_prefill=True))
    prefill_rows = []
    shared_engine.add_tap(lambda site, value, meta: prefill_rows.append(meta.request) if meta.step == 0 else None)
    shared = shared_engine.generate(prompts, params)
    assert [r.prompt_ids for r in shared] == [r.prompt_ids for r in base]
    assert {int(i) for rows in prefill_rows for i in rows} == {0, 3, 6}  # each prompt once, first sample's id
    for a, b in zip(shared, base):
        assert torch.equal(a.prompt_routed_experts, b.prompt_routed_experts)
        if preset == "aligned":
            assert a.token_ids == b.token_ids and torch.equal(a.logprobs, b.logprobs)
            assert torch.equal(a.routed_experts, b.routed_experts)
        else:  # the first token comes from the prefill's logits: same draw, logprob within fp32 noise
            assert a.token_ids[0] == b.token_ids[0]
            assert torch.allclose(a.logprobs[:1], b.logprobs[:1], atol=1e-4)
