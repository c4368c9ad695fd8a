"""Real vLLM (CPU build) in this process: each LLM is created once per test module.

A small KV cache (1 GB) keeps several engines side by side within the 2-core box's memory.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests import engine_cache
from tests.engine_cache import module_engines

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def vllm_llm(zoo):
    """``vllm_llm(zoo name or checkpoint path, dtype="float32", **options) -> LLM``, created once
    per module and kept alive until its end."""
    from minirl.vllm.llm import create_llm

    yield from module_engines(create_llm, zoo)


@pytest.fixture(scope="module")
def prompt_ids() -> torch.Tensor:
    return engine_cache.prompt_ids()
