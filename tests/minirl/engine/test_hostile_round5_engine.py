"""Hostile inputs, round 5 (issue 65), the engine's reading of a checkpoint: each config value it
cannot compute with is refused naming its config.json key (not a kernel's "eps must be > 0"), config
and weights that disagree are refused naming the tensors, an integer weight in a float checkpoint is
refused (it loaded as its raw codes), and what it does accept it scores as transformers does.
Checkpoints are tiny random models (2 layers, hidden 64, vocab 512) made from transformers configs,
with no tokenizer files (EN32). Named by the round-5 case id (EN)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minirl import Engine, Knobs

COMMON = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=128, max_position_embeddings=64, rms_norm_eps=1e-6,
              initializer_range=0.08, pad_token_id=0, bos_token_id=1, eos_token_id=2)
GEMMA = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16,
             final_logit_softcapping=1.5, tie_word_embeddings=True)
BASES = {"llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
         "gemma2": ("Gemma2Config", dict(**GEMMA, attn_logit_softcapping=2.0)),
         "gemma3": ("Gemma3TextConfig", GEMMA)}
IDS = [[5, 9, 33, 100, 7, 8, 2, 40, 41]]
UP, O_PROJ = "model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.o_proj.weight"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Callable[[str], Path]:
    """``base(name)``: the saved tiny checkpoint of ``BASES[name]``, built once."""
    import transformers

    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            cls, fields = BASES[name]
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**COMMON, **fields),
                                                                  dtype=torch.float32)
            built[name] = tmp_path_factory.mktemp(name)
            model.save_pretrained(built[name])
        return built[name]

    return get


def _variant(base, tmp_path, name: str, config: dict | None = None,
             weights: Callable[[dict[str, torch.Tensor]], None] | None = None) -> Path:
    """A copy of ``base(name)`` with ``config`` merged into its config.json and ``weights`` applied."""
    path = tmp_path / name
    shutil.copytree(base(name), path)
    if config:
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**cfg, **config}))
    if weights:
        tensors = load_file(path / "model.safetensors")
        weights(tensors)
        save_file(tensors, path / "model.safetensors")
    return path


def _hf_logprobs(path: Path) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        logp = model.eval()(torch.tensor(IDS)).logits.log_softmax(-1)[0, :-1]
    return logp.gather(1, torch.tensor(IDS[0][1:])[:, None])[:, 0]


def _equal_to_transformers(path: Path) -> None:
    scores = Engine.from_pretrained(path, knobs=Knobs.aligned()).score(IDS)[0]
    torch.testing.assert_close(scores, _hf_logprobs(path), rtol=0, atol=1e-5)


def _refused(path: Path, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Engine.from_pretrained(path)


@pytest.mark.parametrize("case, name", [("EN01", "gemma2"), ("EN06", "gemma3"), ("EN32", "llama")])
def test_EN01_EN06_EN32_gemma_2_and_3_score_as_transformers_with_no_tokenizer(base, case, name):
    assert not list(base(name).glob("tokenizer*"))  # EN32: the engine needs no tokenizer to score
    _equal_to_transformers(base(name))


@pytest.mark.parametrize("case, name, value", [("EN02", "gemma2", 0), ("EN03", "gemma2", float("nan")),
                                               ("EN07", "gemma3", 0)])
def test_EN02_EN03_EN07_a_final_softcap_of_0_or_nan_is_refused_by_name(base, tmp_path, case, name, value):
    _refused(_variant(base, tmp_path, name, {"final_logit_softcapping": value}), "final_logit_softcapping")


def _key(key: str, want: str) -> str:
    return rf"config.json: {key}=.*: {key} must be {want}; fix {key} in the checkpoint's config.json"


POSITIVE = "a positive finite number"


@pytest.mark.parametrize("case, name, config, key, want", [
    ("EN04", "gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar", POSITIVE),
    ("EN05", "gemma2", {"query_pre_attn_scalar": -32}, "query_pre_attn_scalar", POSITIVE),
    ("EN08", "gemma2", {"attn_logit_softcapping": 0}, "attn_logit_softcapping", POSITIVE),
    ("EN10", "gemma2", {"sliding_window": 0}, "sliding_window", "an int >= 1"),
    ("EN11", "llama", {"rms_norm_eps": float("nan")}, "rms_norm_eps", POSITIVE),
    ("EN12", "llama", {"rms_norm_eps": -1}, "rms_norm_eps", POSITIVE),
    ("EN13", "llama", {"rope_theta": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta",
     POSITIVE),
    ("EN14", "llama", {"tie_word_embeddings": "false"}, "tie_word_embeddings",
     r"true or false \(a JSON boolean, not a string\)"),
    ("EN21", "llama", {"num_attention_heads": 0}, "num_attention_heads", "an int >= 1"),
    ("EN22", "llama", {"hidden_size": "abc"}, "hidden_size", "an int >= 1"),
])
def test_EN04_EN22_a_config_value_the_engine_cannot_use_is_refused_by_key(base, tmp_path, case, name, config, key,
                                                                          want):
    _refused(_variant(base, tmp_path, name, config), _key(key, want))


def test_EN09_a_zero_local_rope_base_is_read_as_transformers_reads_it(base, tmp_path):
    """Gemma 3 configs of transformers 5 carry the local base in rope_parameters, which both read."""
    _equal_to_transformers(_variant(base, tmp_path, "gemma3", {"rope_local_base_freq": 0}))


def test_EN15_an_activation_the_mlp_lacks_is_refused_by_key(base, tmp_path):
    _refused(_variant(base, tmp_path, "gemma2", {"hidden_activation": "relu"}),
             r"hidden_activation 'relu' is not supported; the engine's MLP computes")


@pytest.mark.parametrize("case, config, said", [
    ("EN16", {"head_dim": None, "num_attention_heads": 3}, r"wrong shape \(8\): model.layers.0.self_attn.q_proj.weight"),
    ("EN17", {"vocab_size": 1}, r"wrong shape \(2\): model.embed_tokens.weight: got \(512, 64\), expected \(1, 64\)"),
    ("EN18", {"num_hidden_layers": 3}, r"missing \(9\): model.layers.2."),
    ("EN19", {"num_hidden_layers": 1}, r"unexpected \(9\): model.layers.1."),
    ("EN20", {"vocab_size": 1024}, r"model.embed_tokens.weight: got \(512, 64\), expected \(1024, 64\)"),
])
def test_EN16_EN20_config_and_weights_that_disagree_are_refused_naming_the_tensors(base, tmp_path, case, config, said):
    _refused(_variant(base, tmp_path, "llama", config), rf"does not match the llama checkpoint layout.*{said}")


def test_EN23_gemma_over_llama_weights_is_read_as_transformers_reads_it(base, tmp_path):
    _equal_to_transformers(_variant(base, tmp_path, "llama", {"model_type": "gemma"}))


@pytest.mark.parametrize("case, model_type, said", [
    ("EN24", "gemma2", r"does not match the gemma2 checkpoint layout.*missing \(4\): "
                       r"model.layers.0.pre_feedforward_layernorm.weight"),
    ("EN25", "granite", r"the minirl engine does not compute 'granite'"),
    ("EN26", "nonsense", r"unsupported architecture 'nonsense'"),
])
def test_EN24_EN26_a_model_type_over_llama_weights_is_refused_by_type_or_tensors(base, tmp_path, case, model_type,
                                                                                   said):
    _refused(_variant(base, tmp_path, "llama", {"model_type": model_type}), said)


@pytest.mark.parametrize("case, edit, said", [
    ("EN27", lambda w: w.__setitem__(f"{UP}X", w.pop(UP)), rf"missing \(1\): {UP}; unexpected \(2\):.*{UP}X"),
    ("EN28", lambda w: w.__setitem__(UP, w[UP][:-1].contiguous()), rf"{UP}: got \(127, 64\), expected \(128, 64\)"),
    ("EN30", lambda w: w.__setitem__("model.layers.0.self_attn.o_proj.bias", torch.zeros(64)),
     r"unexpected \(1\): model.layers.0.self_attn.o_proj.bias"),
])
def test_EN27_EN28_EN30_a_renamed_reshaped_or_extra_tensor_is_named(base, tmp_path, case, edit, said):
    _refused(_variant(base, tmp_path, "llama", weights=edit), said)


def test_EN29_a_transposed_square_o_proj_is_what_transformers_computes_too(base, tmp_path):
    _equal_to_transformers(_variant(base, tmp_path, "llama", weights=lambda w: w.__setitem__(
        O_PROJ, w[O_PROJ].t().contiguous())))


def test_EN31_an_int8_weight_in_a_float_checkpoint_is_refused(base, tmp_path):
    path = _variant(base, tmp_path, "llama", weights=lambda w: w.__setitem__(
        "model.embed_tokens.weight", w["model.embed_tokens.weight"].to(torch.int8)))
    _refused(path, rf"{path / 'model.safetensors'}: tensor 'model.embed_tokens.weight' is int8, an integer weight in a "
                   rf"float checkpoint")


def _header_plus_1e9(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", struct.unpack("<Q", data[:8])[0] + 10**9)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case, damage, said", [
    ("EN33", lambda p: p.write_bytes(b""), "header too small"),
    ("EN34", _header_plus_1e9, "header too large"),
])
def test_EN33_EN34_an_unreadable_safetensors_is_refused_naming_the_file(base, tmp_path, case, damage, said):
    path = _variant(base, tmp_path, "llama")
    damage(path / "model.safetensors")
    _refused(path, rf"{path / 'model.safetensors'} is not a readable safetensors file \(.*{said}\); re-save")


def test_EN35_a_fifo_config_is_refused_at_once(base, tmp_path):
    """Nothing opens it (an open would wait for a writer): ``pytest.raises`` returns."""
    path = _variant(base, tmp_path, "llama")
    (path / "config.json").unlink()
    os.mkfifo(path / "config.json")
    _refused(path, rf"{path / 'config.json'} is not a regular file \(a FIFO\)")


def test_EN36_a_json_list_config_is_refused_by_what_it_holds(base, tmp_path):
    path = _variant(base, tmp_path, "llama")
    (path / "config.json").write_text("[1, 2]")
    _refused(path, r"config.json must hold a JSON object; got list")
