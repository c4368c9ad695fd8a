"""The tiny model zoo builds real, loadable, deterministic HF checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

from labs import zoo as zoo_mod

REQUIRED = {"tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral", "tiny-ring-linear"}


def test_names_cover_required_architectures():
    assert REQUIRED <= set(zoo_mod.names())


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_checkpoint_loads_with_plain_transformers(zoo, name):
    path = zoo(name)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "zoo.json"):
        assert (path / f).exists(), f
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok("The router of a mixture of experts", return_tensors="pt")["input_ids"]
    assert tok.decode(ids[0]) == "The router of a mixture of experts"
    with torch.no_grad():
        logits = model(ids).logits[0].float()  # [S, V]
    cfg = json.loads((path / "config.json").read_text())
    assert 64 <= cfg["hidden_size"] <= 256 and 2 <= cfg["num_hidden_layers"] <= 6
    # Realistic scale: trained briefly, so next-token distributions are peaked, not uniform.
    entropy = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum(-1)  # [S]
    uniform = torch.log(torch.tensor(float(logits.shape[-1])))
    assert entropy.mean() < 0.75 * uniform, (entropy.mean(), uniform)
    assert logits.std(-1).mean() > 1.0


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_moe_models_have_8_experts_top2(zoo, name):
    cfg = transformers.AutoConfig.from_pretrained(zoo(name))
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts")
    assert (experts, cfg.num_experts_per_tok) == (8, 2)


def test_same_name_and_seed_is_byte_identical(tmp_path):
    a = zoo_mod.build("tiny-llama", out=tmp_path / "a", seed=3)
    b = zoo_mod.build("tiny-llama", out=tmp_path / "b", seed=3)
    c = zoo_mod.build("tiny-llama", out=tmp_path / "c", seed=4)
    assert zoo_mod.weights_hash(a) == zoo_mod.weights_hash(b)
    assert zoo_mod.weights_hash(a) != zoo_mod.weights_hash(c)


def test_cached_build_is_reused(zoo):
    path = zoo("tiny-qwen3")
    mtime = os.stat(path / "model.safetensors").st_mtime_ns
    assert zoo_mod.build("tiny-qwen3", out=path) == path
    assert os.stat(path / "model.safetensors").st_mtime_ns == mtime


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="tiny-llama"):
        zoo_mod.build("tiny-gpt5")


def test_unwritable_output_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(OSError, match="MLAB_ZOO_DIR"):
        zoo_mod.build("tiny-llama", out=blocker / "m")


def test_failed_rebuild_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = zoo_mod.build("tiny-llama", out=tmp_path / "m")
    before = zoo_mod.weights_hash(path)

    def boom(*a, **k):
        raise RuntimeError("simulated crash mid-build")

    monkeypatch.setattr(zoo_mod, "_train_briefly", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        zoo_mod.build("tiny-llama", out=path, force=True)
    assert zoo_mod.weights_hash(path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs left behind"


def test_a_truncated_or_altered_cached_checkpoint_is_not_reused(zoo, tmp_path):
    """The cache check that decides between "reuse" and "rebuild" sees truncation and bit flips."""
    import shutil

    path = tmp_path / "m"
    shutil.copytree(zoo("tiny-llama"), path)
    fingerprint = json.loads((path / "zoo.json").read_text())["fingerprint"]
    assert zoo_mod._is_complete(path, fingerprint)
    weights = path / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:1000])  # truncated: the size no longer matches zoo.json
    assert not zoo_mod._is_complete(path, fingerprint)
    altered = bytearray(original)
    altered[-1] ^= 0xFF  # same size, one byte changed: the sha256 catches it
    weights.write_bytes(bytes(altered))
    assert not zoo_mod._is_complete(path, fingerprint)
