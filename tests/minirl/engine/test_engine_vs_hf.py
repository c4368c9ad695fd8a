"""The engine against transformers' forward (the independent ground truth), per zoo model."""

from __future__ import annotations

import pytest
import torch

from minirl import Engine, Knobs, SamplingParams

ZOO_ARCHS = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral"]


@pytest.mark.parametrize("name", ZOO_ARCHS)
def test_aligned_fp32_matches_hf_in_prefill_and_decode(name, engine, hf_model, hf_logprobs, prompts):
    eng, hf = engine(name, knobs=Knobs.aligned()), hf_model(name)
    for ids, lp in zip(prompts, eng.score(prompts)):
        assert lp.dtype == torch.float32 and lp.shape == (len(ids) - 1,)
        torch.testing.assert_close(lp, hf_logprobs(hf, ids), rtol=0, atol=1e-5)

    outs = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=3, ignore_eos=True))
    assert len(outs) == 6 and [o.prompt_ids for o in outs[::2]] == prompts
    for o in outs:
        assert len(o.token_ids) == 8 and o.finish_reason == "length"
        ref = hf_logprobs(hf, o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1:]  # generated tokens
        torch.testing.assert_close(o.logprobs, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ZOO_ARCHS)
def test_typical_bf16_mismatch_is_nonzero_and_larger_than_the_hf_recipe(name, engine, hf_model, hf_logprobs, prompts):
    """Reported, not asserted to a number: |logprob_engine - logprob_hf| on the same tokens.

    ``aligned`` with the lm_head and router left in bf16 is transformers' own bf16 recipe, so
    it must be closer to the bf16 trainer than the inference-engine defaults.
    """
    hf = hf_model(name, torch.bfloat16)
    seqs = [o.prompt_ids + o.token_ids for o in engine(name).generate(
        prompts, SamplingParams(max_new_tokens=12, seed=0, ignore_eos=True))]
    ref = torch.cat([hf_logprobs(hf, s) for s in seqs])
    mismatch = {}
    for label, knobs in (("typical", Knobs.typical_inference()),
                         ("hf_recipe", Knobs.aligned().replace(lm_head_dtype="act", router_dtype="act"))):
        lp = torch.cat(engine(name, "bfloat16", knobs).score(seqs))
        mismatch[label] = (lp - ref).abs().mean().item()
    print(f"\n{name} bf16 mean |dlogprob| vs transformers bf16: {mismatch}")
    assert mismatch["typical"] > 0
    assert mismatch["hf_recipe"] < mismatch["typical"]


def test_decode_recompute_equals_incremental_in_fp32(engine, prompts):
    """decode="recompute" re-runs the whole prefix (the trainer's view); same tokens and
    logprobs as the KV-cache decode up to fp32 rounding."""
    params = SamplingParams(max_new_tokens=6, seed=11, ignore_eos=True)
    inc = engine("tiny-qwen3-moe", knobs=Knobs.aligned()).generate(prompts, params)
    rec = engine("tiny-qwen3-moe", knobs=Knobs.aligned().replace(decode="recompute")).generate(prompts, params)
    for a, b in zip(inc, rec):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
        torch.testing.assert_close(a.routed_experts, b.routed_experts)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_hf_exact_preset_is_bit_identical_to_stock_bf16_hf(zoo, attn):
    """Knobs.hf_exact() with the trainer's attention backend reproduces bf16 transformers exactly
    (sdpa is what from_pretrained picks by default, eager what a trainer may choose)."""
    from minirl.engines import load_hf

    from aligntools.gates.inputs import prepare_tokens

    path = zoo("tiny-qwen3-moe")
    ids = prepare_tokens(path, 512)  # [B, S]: enough tokens that bf16 router scores tie exactly
    hf = load_hf(path, "bfloat16", attn=attn)
    with torch.no_grad():
        ref = hf(ids).logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # [B, S-1]
    exact = Knobs.hf_exact().replace(attention=attn)
    cases = [(exact, True), (Knobs.typical_inference(), False)]
    if attn == "eager":  # these 512 tokens hit an exact bf16 router-score tie under eager attention
        cases.append((exact.replace(topk="stable"), False))
    for knobs, same in cases:
        got = torch.stack(Engine.from_pretrained(path, dtype="bfloat16", knobs=knobs).score(ids.tolist()))
        assert torch.equal(got, ref) == same, knobs


_MOE_CONFIGS = {  # fp32 routing weights at top-2 (Mixtral), bf16 weights at top-8 (Qwen3-MoE's real k)
    "mixtral": ("MixtralConfig", dict(num_local_experts=8, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=16, num_experts_per_tok=8, moe_intermediate_size=64,
                                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
}


@pytest.mark.parametrize("family", _MOE_CONFIGS)
def test_each_expert_sum_order_is_one_transformers_experts_path(family, tmp_path):
    """transformers 5 runs MoE experts through ``grouped_mm`` unless told otherwise (one fp32
    ``sum`` over the k slots, rounded once) and through a per-expert ``index_add_`` loop when
    told ``experts_implementation="eager"`` (each weighted output rounded, then added in bf16).
    ``hf_exact`` must be the default path bit for bit, and ``expert_id`` the eager one: on these
    two configs the two paths differ, so each knob value is also checked against the other."""
    import transformers

    from minirl.engines import load_hf

    cls, fields = _MOE_CONFIGS[family]
    cfg = getattr(transformers, cls)(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=64, initializer_range=0.1, **fields)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    ids = torch.randint(3, 256, (4, 24), generator=torch.Generator().manual_seed(1))  # [B, S]
    refs = {}
    for impl in ("grouped_mm", "eager"):
        hf = load_hf(tmp_path, "bfloat16", attn="eager", experts=impl)
        with torch.no_grad():
            refs[impl] = hf(ids).logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    assert not torch.equal(refs["grouped_mm"], refs["eager"])  # else this config tells the orders apart in nothing
    for order, impl in (("grouped_mm", "grouped_mm"), ("expert_id", "eager")):
        knobs = Knobs.hf_exact().replace(expert_sum_order=order)
        got = torch.stack(Engine.from_pretrained(tmp_path, dtype="bfloat16", knobs=knobs).score(ids.tolist()))
        other = "eager" if impl == "grouped_mm" else "grouped_mm"
        assert torch.equal(got, refs[impl]) and not torch.equal(got, refs[other]), (order, impl)
    assert Knobs.hf_exact().expert_sum_order == "grouped_mm"  # the path a stock trainer runs
