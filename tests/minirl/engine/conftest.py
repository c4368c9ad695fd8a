"""Fixtures for the minirl engine tests: zoo checkpoints, transformers as ground truth.

transformers is loaded with the eager attention and eager expert loop, the reference math the
``aligned`` knobs reproduce (in fp32 every backend agrees to ~1e-7 anyway).
"""

from __future__ import annotations

import pytest
import torch

@pytest.fixture(scope="session")
def hf_model(zoo):
    """``hf_model(name, dtype)`` -> the zoo checkpoint in transformers (eval, cached)."""
    import transformers

    cache: dict[tuple[str, torch.dtype], torch.nn.Module] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        if (name, dtype) not in cache:
            cache[name, dtype] = transformers.AutoModelForCausalLM.from_pretrained(
                zoo(name), dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()
        return cache[name, dtype]

    return get


@pytest.fixture(scope="session")
def engine(zoo):
    """``engine(name, dtype="float32", knobs=None)`` -> a fresh minirl Engine on a zoo model."""
    from minirl import Engine

    return lambda name, dtype="float32", knobs=None: Engine.from_pretrained(zoo(name), dtype=dtype, knobs=knobs)


@pytest.fixture(scope="session")
def hf_logprobs():
    """``hf_logprobs(model, ids) -> [len-1]`` float32 raw logprobs of ids[1:] (full forward)."""

    @torch.no_grad()
    def run(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        logits = model(torch.tensor([ids])).logits[0].float()  # [S, V]
        return logits.log_softmax(-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]

    return run


@pytest.fixture
def prompts() -> list[list[int]]:
    """Three prompts of different lengths, ids away from the special tokens (0-2)."""
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in (6, 3, 9)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one intra-op thread is faster, and far steadier on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
