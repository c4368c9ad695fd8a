"""Fixtures of the audit tests: the zoo's tiny dense and MoE models, loaded once in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def llama(zoo) -> Path:
    return zoo("tiny-llama")


def _load(path: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def llama_model(llama):
    return _load(llama)


@pytest.fixture(scope="session")
def moe_model(zoo):
    return _load(zoo("tiny-qwen3-moe"))
