"""load_weights(): in-place sync from the training model, and its refusals."""

from __future__ import annotations

import pytest
import torch

from minirl import Engine, SamplingParams
from minirl.engine.checkpoint import read_safetensors

PARAMS = SamplingParams(n=2, max_new_tokens=6, seed=8, ignore_eos=True)


def _perturbed_hf(path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _same(a, b) -> bool:
    return all(x.token_ids == y.token_ids and torch.equal(x.logprobs, y.logprobs)
               and (x.routed_experts is None or torch.equal(x.routed_experts, y.routed_experts))
               for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_generate_after_sync_equals_a_freshly_loaded_engine(name, zoo, prompts, tmp_path):
    trained = _perturbed_hf(zoo(name))  # stands in for the model after an RL step
    eng = Engine.from_pretrained(zoo(name))
    before = eng.generate(prompts, PARAMS)
    qkv = eng.model.w["L0.qkv"]
    eng.load_weights(trained)  # transformers 5 in-memory layout (fused 3-D experts)
    assert eng.model.w["L0.qkv"] is qkv  # in place: no reallocation
    trained.save_pretrained(tmp_path)  # on-disk layout (per-expert tensors)
    fresh = Engine.from_pretrained(tmp_path)
    synced = eng.generate(prompts, PARAMS)
    assert _same(synced, fresh.generate(prompts, PARAMS))
    assert not _same(synced, before)
    eng.load_weights(read_safetensors(zoo(name)))  # back to the original, from the disk layout
    assert _same(eng.generate(prompts, PARAMS), before)


def test_mismatched_state_dicts_are_refused_and_leave_weights_untouched(engine, zoo, prompts):
    eng = engine("tiny-qwen3-moe")
    before = eng.score(prompts)
    good = read_safetensors(zoo("tiny-qwen3-moe"))
    bad_cases = {
        "missing": ({k: v for k, v in good.items() if k != "model.layers.1.self_attn.k_proj.weight"},
                    "model.layers.1.self_attn.k_proj.weight"),
        "wrong shape": ({**{k: v * 2 for k, v in good.items()}, "model.norm.weight": torch.ones(7)},
                        "model.norm.weight: got (7,), expected (128,)"),
        "unexpected": ({**good, "model.layers.0.mlp.shared_expert.weight": torch.ones(3)},
                       "model.layers.0.mlp.shared_expert.weight"),
    }
    for label, (sd, named) in bad_cases.items():
        with pytest.raises(ValueError, match=label) as err:
            eng.load_weights(sd)
        assert named in str(err.value) and "left untouched" in str(err.value)
    after = eng.score(prompts)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
