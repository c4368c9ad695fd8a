"""Checkpoints never lose or corrupt a run: tied weights saved once and re-tied, non-finite
tensors never written nor resumed, a crash's ``.checkpoint.old`` recovered, damaged files refused
naming the file (each case failed on the earlier checkpoint code)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minirl.training import checkpointing


def tied_llama(seed: int = 0):
    """A 2-layer Llama whose lm_head *is* embed_tokens (smollm2-135m's layout), after one AdamW step."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.arange(8)[None], labels=torch.arange(8)[None]).loss.backward()
    opt.step()
    return model, opt


@pytest.fixture
def saved(tmp_path):
    model, opt = tied_llama()
    path = checkpointing.save(tmp_path / "checkpoint", model, opt, {"step": 1})
    return path, model, opt


def test_tied_weights_saved_once_and_retied_bit_exact(saved):
    path, model, opt = saved
    with safe_open(path / "model.safetensors", "pt") as f:
        keys, tied = set(f.keys()), json.loads(f.metadata()["tied"])
    assert tied == {"lm_head.weight": "model.embed_tokens.weight"} and "lm_head.weight" not in keys
    fresh, fresh_opt = tied_llama(seed=1)
    checkpointing.load(path, fresh, fresh_opt)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight  # still one parameter
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    mine, theirs = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert mine.keys() == theirs.keys() and len(mine) == len(list(model.parameters()))
    assert all(torch.equal(mine[i][k], theirs[i][k]) for i in mine for k in mine[i])


def test_non_finite_weight_is_never_saved(saved):
    path, model, opt = saved
    before = (path / "model.safetensors").read_bytes()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(checkpointing.CheckpointError, match="weight 'model.layers.1.mlp.up_proj.weight' has 1 "
                                                            "non-finite values"):
        checkpointing.save(path, model, opt, {"step": 2})
    assert (path / "model.safetensors").read_bytes() == before  # the previous checkpoint is untouched


def test_checkpoint_with_a_nan_tensor_is_refused_on_resume(saved):
    path, _, _ = saved
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"][3] = float("inf")
    with safe_open(path / "model.safetensors", "pt") as f:
        meta = f.metadata()
    save_file(weights, path / "model.safetensors", metadata=meta)
    model, opt = tied_llama()
    with pytest.raises(checkpointing.CheckpointError,
                       match=f"{path / 'model.safetensors'} cannot be resumed: tensor 'model.norm.weight'"):
        checkpointing.load(path, model, opt)


def test_only_old_checkpoint_left_by_a_crash_is_recovered_never_deleted(saved, tmp_path):
    path, model, opt = saved
    old = tmp_path / ".checkpoint.old"
    path.rename(old)  # a crash between save's two renames
    assert checkpointing.exists(path)
    fresh, fresh_opt = tied_llama(seed=1)
    assert checkpointing.load(path, fresh, fresh_opt)["step"] == 1
    assert (path / "state.json").exists() and torch.equal(fresh.lm_head.weight, model.lm_head.weight)
    path.rename(old)
    checkpointing.save(tmp_path / "other", model, opt, {"step": 2})  # a save elsewhere leaves it alone
    checkpointing.save(path, model, opt, {"step": 2})  # a fresh save at path does not delete it either
    assert (old / "state.json").exists()


@pytest.mark.parametrize("name, damage", [
    ("state.json", lambda f: f.write_text("{not json")),
    ("state.json", lambda f: f.write_text("[1, 2]")),
    ("model.safetensors", lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])),
    ("model.safetensors", lambda f: save_file({"x": torch.zeros(2)}, f)),
    ("optimizer.safetensors", lambda f: f.write_bytes(b"\0" * 64)),
    ("optimizer.json", lambda f: f.write_text('[{"lr": 0.01}]')),
    ("rng.safetensors", lambda f: save_file({"torch": torch.zeros(3)}, f)),
])
def test_damaged_file_is_refused_naming_it(saved, name, damage):
    path, _, _ = saved
    damage(path / name)
    model, opt = tied_llama(seed=1)
    with pytest.raises(checkpointing.CheckpointError, match=str(path / name)):
        checkpointing.load(path, model, opt)


def test_incomplete_checkpoint_dir_is_refused_not_replaced(saved, tmp_path):
    path, model, opt = saved
    shutil.copytree(path, tmp_path / ".checkpoint.old")
    (path / "state.json").unlink()
    with pytest.raises(checkpointing.CheckpointError, match="no state.json: it is not a complete checkpoint"):
        checkpointing.recover(path)
