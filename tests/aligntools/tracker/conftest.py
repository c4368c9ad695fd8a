"""Fixtures for the Tracker tests: zoo models loaded once per session, small inputs."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def hf_model(zoo):
    """``hf_model(name)`` -> the zoo checkpoint loaded with transformers (fp32, eval, cached)."""
    import transformers

    cache: dict[str, torch.nn.Module] = {}

    def get(name: str) -> torch.nn.Module:
        if name not in cache:
            cache[name] = transformers.AutoModelForCausalLM.from_pretrained(zoo(name), dtype=torch.float32).eval()
        return cache[name]

    return get


@pytest.fixture(scope="session")
def olmoe():
    """A tiny random OLMoE (not in the zoo): a third router flavour (no renormalisation)."""
    import transformers

    cfg = transformers.OlmoeConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, num_experts=4,
                                   num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture
def ids() -> torch.Tensor:
    """[2, 7] token ids away from the special tokens (0-2)."""
    return torch.randint(3, 120, (2, 7), generator=torch.Generator().manual_seed(1))
