"""Tiny checkpoints of each architecture family (tests/families/tiny.py), built once per session
under the zoo's cache directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.families import tiny

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

#: One family of each shape stays in ``make test``; the rest of docs/models.md's table is ``slow``.
FAST = ("llama", "qwen3_moe", "gemma2", "granite", "olmo2")
#: Families vLLM's CPU build cannot run (docs/models.md says why): refused by name before it starts.
NOT_SERVED = ("deepseek_v3",)


def families(fast: tuple[str, ...] = FAST, skip: tuple[str, ...] = ()) -> list:
    """``tiny.FAMILIES`` (less ``skip``) as pytest params: those in ``fast`` plain, the others ``slow``."""
    return [pytest.param(f, marks=() if f in fast else pytest.mark.slow) for f in tiny.FAMILIES if f not in skip]


@pytest.fixture(scope="session")
def family_checkpoint(zoo_root: Path, zoo):
    """``family_checkpoint(model_type) -> Path`` of its tiny random checkpoint (cached)."""

    def get(model_type: str) -> Path:
        return tiny.build(model_type, zoo_root / "families" / model_type, tokenizer_from=zoo("tiny-qwen3"))

    return get
