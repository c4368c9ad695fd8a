"""Every family the engine accepts, on a tiny random checkpoint, against transformers fp32.

Each checkpoint is 2 layers, hidden 128, head_dim 32, with its norm weights pushed off their
init (a ``1 + weight`` norm at its zero init, or a Llama norm at one, would hide a wrong norm).
The knobs that make a family differ from Llama are set so that they bite on 9-token prompts:
sliding windows of 4, soft-caps near the logits' scale, a ``clip_qkv`` below the largest
projections, a NoPE layer.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from minirl import Engine, Knobs, SamplingParams
from minirl.engine.archs import REFUSED

_COMMON = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=32, intermediate_size=256, max_position_embeddings=64, rms_norm_eps=1e-6,
               initializer_range=0.08, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
_GEMMA2 = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24)

FAMILIES = {  # name -> (transformers config class, its fields)
    "mistral": ("MistralConfig", dict(sliding_window=4)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(**_MOE, shared_expert_intermediate_size=96, decoder_sparse_step=1,
                                         norm_topk_prob=False, mlp_only_layers=[])),
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, intermediate_size=64, clip_qkv=0.5)),
    "smollm3": ("SmolLM3Config", dict(no_rope_layers=[1, 0])),
    "arcee": ("ArceeConfig", dict()),
    "seed_oss": ("SeedOssConfig", dict(attention_bias=True, attention_out_bias=True)),
    "gemma": ("GemmaConfig", dict(tie_word_embeddings=True)),
    "gemma2": ("Gemma2Config", dict(**_GEMMA2, attn_logit_softcapping=2.0, final_logit_softcapping=1.5)),
    "gemma3_text": ("Gemma3TextConfig", dict(**_GEMMA2, tie_word_embeddings=True, final_logit_softcapping=1.5,
                                             rope_parameters={"full_attention": {"rope_type": "default",
                                                                                 "rope_theta": 10000.0},
                                                              "sliding_attention": {"rope_type": "default",
                                                                                    "rope_theta": 50.0}})),
}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """``family(name)`` -> (checkpoint dir, transformers fp32 model), built once per module."""
    import transformers

    built: dict[str, tuple] = {}

    def get(name: str):
        if name not in built:
            cls, fields = FAMILIES[name]
            common = {k: v for k, v in _COMMON.items() if k != "head_dim" or name != "olmoe"}  # 128 / 4 heads
            cfg = getattr(transformers, cls)(**{**common, **fields})
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                                  dtype=torch.float32).eval()
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "norm" in n:
                        p.add_(0.5 * torch.randn_like(p))
            path = tmp_path_factory.mktemp(name)
            model.save_pretrained(path)
            built[name] = path, model
        return built[name]

    return get


@pytest.mark.parametrize("name", FAMILIES)
def test_aligned_fp32_matches_transformers_in_prefill_and_decode(name, family, hf_logprobs):
    path, hf = family(name)
    eng = Engine.from_pretrained(path, knobs=Knobs.aligned())
    assert eng.arch == name
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (9, 3, 6)]
    scores = eng.score(prompts)
    for ids, lp in zip(prompts, scores):
        torch.testing.assert_close(lp, hf_logprobs(hf, ids), rtol=0, atol=1e-5)
    eng.load_weights(hf)  # the trainer's sync: transformers 5's in-memory names (fused experts)
    assert all(torch.equal(a, b) for a, b in zip(eng.score(prompts), scores))
    outs = eng.generate(prompts, SamplingParams(max_new_tokens=8, seed=3, ignore_eos=True))
    for o in outs:  # decode runs past every sliding window (4) of the tiny configs
        ref = hf_logprobs(hf, o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1:]
        torch.testing.assert_close(o.logprobs, ref, rtol=0, atol=1e-5)


NO_SDPA = {"gemma2"}  # transformers refuses sdpa for Gemma 2 (its soft-capped attention): eager only


@pytest.mark.parametrize("name, attn", [(n, a) for n in FAMILIES for a in ("eager", "sdpa")
                                        if not (a == "sdpa" and n in NO_SDPA)])
def test_hf_exact_bf16_is_transformers_bf16_bit_for_bit(name, attn, family):
    """What the on-policy bitwise setting (configs/on_policy_bitwise.yaml) rests on, per family: ``hf_exact``
    in bf16 scores exactly what transformers in bf16 computes, with the trainer's attention backend."""
    from minirl.engines import load_hf

    path, _ = family(name)
    ids = torch.randint(3, 512, (3, 12), generator=torch.Generator().manual_seed(1))  # [B, S]
    with torch.no_grad():
        logits = load_hf(path, "bfloat16", attn=attn)(ids).logits.float()  # [B, S, V]
    ref = logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # [B, S-1]
    eng = Engine.from_pretrained(path, dtype="bfloat16", knobs=Knobs.hf_exact().replace(attention=attn))
    assert torch.equal(torch.stack(eng.score(ids.tolist())), ref)


@pytest.mark.parametrize("name, knob", [("gemma3_text", dict(sliding_window=False)),
                                        ("gemma2", dict(attention="sdpa")),
                                        ("gemma3_text", dict(rmsnorm="bf16_compute")),
                                        ("arcee", dict(activation="fused_silu_mul"))])
def test_the_family_specific_numerics_are_knobs(name, knob, family, hf_logprobs):
    """A knob moves the family's own numerics: the window turned off sees old keys, a soft-capped
    sdpa computes in fp32 (a last-bit change), the Gemma norm in bf16, the fused ReLU²."""
    path, hf = family(name)
    ids = torch.randint(3, 512, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf_logprobs(hf, ids)
    lp = Engine.from_pretrained(path, knobs=Knobs.aligned().replace(**knob)).score([ids])[0]
    gap = (lp - ref).abs().max().item()
    if knob == dict(sliding_window=False):
        assert gap > 1e-3, gap
    elif knob == dict(rmsnorm="bf16_compute"):
        assert 1e-4 < gap, gap
    else:  # fp32 either way: the same numbers up to rounding order
        assert gap < 1e-5, gap


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_family_is_refused_by_name_with_the_reason(model_type, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 128}))
    with pytest.raises(ValueError, match=re.escape(f"does not compute {model_type!r}: {REFUSED[model_type]}")):
        Engine.from_pretrained(tmp_path)  # before any weight is read
