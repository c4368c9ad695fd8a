"""Bad input fails early with a message that names the problem and the fix."""

from __future__ import annotations

import json

import pytest

from minirl import Engine, Knobs, SamplingParams


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), r"n=0.*n >= 1"),
    (dict(top_p=0.0), r"top_p=0.0 outside \(0, 1\].*1.0 to disable"),
    (dict(top_p=1.5), r"top_p=1.5 outside"),
    (dict(temperature=-0.1), r"temperature=-0.1 < 0.*0 for greedy"),
    (dict(top_k=-3), r"top_k=-3"),
    (dict(max_new_tokens=0), r"max_new_tokens=0"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_prompts(engine):
    eng = engine("tiny-llama")
    limit = eng.spec.max_positions
    with pytest.raises(ValueError, match="prompts is empty"):
        eng.generate([], SamplingParams())
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        eng.generate([[5], []], SamplingParams())
    with pytest.raises(ValueError, match=rf"prompts\[0\] has {limit} tokens.*max_position_embeddings is "
                                         rf"{limit}.*at most {limit - 1}"):
        eng.generate([[5] * limit], SamplingParams())
    with pytest.raises(ValueError, match=rf"token_ids\[0\] has {limit + 1} tokens"):
        eng.score([[5] * (limit + 1)])
    with pytest.raises(ValueError, match=r"outside \[0, 512\): \[512, -1\]"):
        eng.score([[5, 512, -1]])
    assert eng.score([[5] * limit])[0].shape == (limit - 1,)  # exactly max positions is fine


def test_unsupported_architecture_names_the_supported_list(zoo, tmp_path):
    cfg = json.loads((zoo("tiny-llama") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
    with pytest.raises(ValueError, match=r"unsupported architecture 'falcon'.*"
                                         r"llama, mistral, qwen2, .*gemma3_text, bailing_hybrid"):
        Engine.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu_new"}))
    with pytest.raises(ValueError, match="hidden_act 'gelu_new' is not supported"):
        Engine.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match="no model.safetensors.*Pickle checkpoints"):
        Engine.from_pretrained(tmp_path)


@pytest.mark.parametrize("changes, message", [
    (dict(attention="flash"), r"knob attention='flash'; valid: \['sdpa', 'eager'\]"),
    (dict(rmsnorm="fast"), r"knob rmsnorm='fast' is not a kernels rmsnorm variant"),
    (dict(kv_cache_dtype="fp8"), r"unknown dtype 'fp8'"),
    (dict(tp=3), r"tp=3 must divide attention heads=4"),
    (dict(tp=0), r"tp=0 must be >= 1"),
])
def test_bad_knobs(engine, changes, message):
    with pytest.raises(ValueError, match=message):
        engine("tiny-qwen3-moe", knobs=Knobs().replace(**changes))


def test_a_knob_names_numerics_not_triton(zoo):
    """Kernel knobs name what is computed; the device picks Triton (``kernels.get``)."""
    with pytest.raises(ValueError, match=r"rmsnorm='triton' is not a kernels rmsnorm variant; valid: \['"):
        Engine.from_pretrained(zoo("tiny-llama"), knobs=Knobs.aligned().replace(rmsnorm="triton"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), r"temperature=nan: must be a finite number"),
    (dict(top_p=float("inf")), r"top_p=inf: must be a finite number"),
    (dict(max_new_tokens=2.5), r"max_new_tokens=2.5: must be an int, not float"),
    (dict(n=True), r"n=True: must be an int, not bool"),
    (dict(seed=1.5), r"seed=1.5: must be an int"),
    (dict(stop_token_ids=("x",)), r"stop_token_ids entry='x'"),
])
def test_sampling_params_reject_wrong_types(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_prompt_ids_must_be_ints(engine):
    eng = engine("tiny-llama")
    with pytest.raises(TypeError, match=r"prompts\[0\] holds float values; token ids must be ints"):
        eng.generate([[5.0, 6.7]], SamplingParams())
    with pytest.raises(TypeError, match=r"token_ids\[0\] holds str values"):
        eng.score([["5", "6"]])


def test_load_weights_refuses_lists_and_meta_tensors_without_touching_the_engine(engine, zoo):
    import numpy as np
    import torch
    from safetensors.torch import load_file

    eng = engine("tiny-llama")
    before = eng.score([[5, 6, 7, 8]])[0]
    for bad in ([1, 2], np.zeros(3)):
        with pytest.raises(TypeError, match="load_weights takes the training model"):
            eng.load_weights(bad)
    sd = load_file(str(zoo("tiny-llama") / "model.safetensors"))
    sd["model.layers.3.mlp.down_proj.weight"] = torch.empty_like(sd["model.layers.3.mlp.down_proj.weight"],
                                                                 device="meta")
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * 2  # would change results if copied
    with pytest.raises(ValueError, match="meta device.*engine weights left untouched"):
        eng.load_weights(sd)
    torch.testing.assert_close(eng.score([[5, 6, 7, 8]])[0], before, rtol=0, atol=0)


def test_corrupt_config_names_the_problem(zoo, tmp_path):
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object"):
        Engine.from_pretrained(tmp_path)
    cfg = json.loads((zoo("tiny-llama") / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lacks the field 'hidden_size'"):
        Engine.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json.*not valid JSON"):
        Engine.from_pretrained(tmp_path)
