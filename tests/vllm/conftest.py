"""Real vLLM (CPU build) in this process: each LLM is created once per test module.

A small KV cache (1 GB) keeps several engines side by side within the 2-core box's memory.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def vllm_llm(zoo):
    """``vllm_llm(zoo name or checkpoint path, dtype="float32", **options) -> LLM``, created once
    per module and kept alive until its end."""
    from minirl.vllm.llm import create_llm

    made: dict[tuple, object] = {}

    def get(name: str | Path, dtype: str = "float32", **options):
        key = (str(name), dtype, tuple(sorted(options.items())))
        if key not in made:  # deleting an LLM mid-module would tear down vLLM's process-wide groups
            made[key] = create_llm(zoo(name) if isinstance(name, str) else name, dtype, **options)
        return made[key]

    yield get
    made.clear()
    gc.collect()


@pytest.fixture(scope="module")
def prompt_ids() -> torch.Tensor:
    """[3, 24] token ids, the same for every engine of a test module."""
    return torch.randint(3, 500, (3, 24), generator=torch.Generator().manual_seed(0))
