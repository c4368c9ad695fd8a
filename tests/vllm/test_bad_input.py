"""Each misuse of the vLLM engine gets an error that names the problem and the fix."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

import aligntools
from minirl import EngineSpec
from minirl.vllm import llm as vllm_engine
from tests.vllm.needs import needs_vllm


def test_missing_vllm_is_a_one_line_reason(monkeypatch, zoo):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    reason = vllm_engine.unavailable_reason()
    assert reason.startswith("vllm is not installed") and "\n" not in reason
    with pytest.raises(vllm_engine.VllmUnavailable, match="not installed"):
        vllm_engine.create_llm(zoo("tiny-llama"), "bfloat16")


def test_unknown_spec_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown vllm option 'kv_cache'.*max_model_len=<int>.*prefix_caching"):
        EngineSpec.parse("vllm:bfloat16,kv_cache=4")
    with pytest.raises(ValueError, match="not a int"):
        EngineSpec.parse("vllm,max_model_len=big")
    with pytest.raises(ValueError, match=r"'int8' is not a vllm dtype \(float32, bfloat16, float16\)"):
        EngineSpec.parse("vllm:int8")
    spec = EngineSpec.parse("vllm:bfloat16,max_model_len=128,prefix_caching=off")
    assert (spec.kind, spec.dtype, spec.options) == ("vllm", "bfloat16", {"max_model_len": 128, "prefix_caching": False})


@needs_vllm
def test_unsupported_head_size_is_named(zoo, tmp_path):
    path = tmp_path / "hd24"
    shutil.copytree(zoo("tiny-llama"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "head_dim": 24}))
    with pytest.raises(ValueError, match=r"head_dim=24 is not supported by vLLM's CPU attention"):
        vllm_engine.create_llm(path, "bfloat16")


@needs_vllm
def test_unsupported_architecture_is_named(zoo):
    with pytest.raises(ValueError, match=r"no implementation of architecture \['BailingHybridForCausalLM'\]"):
        vllm_engine.create_llm(zoo("tiny-ring-linear"), "bfloat16")


@needs_vllm
def test_out_of_process_engine_is_refused(monkeypatch, zoo):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(vllm_engine.VllmUnavailable, match="out of reach of capture hooks"):
        vllm_engine.create_llm(zoo("tiny-llama"), "bfloat16")


@needs_vllm
def test_sequence_longer_than_max_model_len(vllm_llm):
    llm = vllm_llm("tiny-llama", max_model_len=32)
    with pytest.raises(ValueError, match="does not fit vLLM's max_model_len=32"):
        aligntools.capture(llm, torch.ones(1, 40, dtype=torch.long), progress=False)
