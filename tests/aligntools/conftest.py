"""Fixtures of the gate tests: the zoo MoE checkpoint and a corrupt copy of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def moe(zoo) -> Path:
    return zoo("tiny-qwen3-moe")


@pytest.fixture
def corrupt_checkpoint(moe, tmp_path) -> Path:
    """config.json and tokenizer intact, model.safetensors truncated to garbage."""
    bad = tmp_path / "corrupt"
    shutil.copytree(moe, bad)
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    return bad
