"""Fixtures for the RL-core tests: the zoo MoE, its HF model, and a quick task config."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def moe_path(zoo):
    return zoo("tiny-qwen3-moe")


@pytest.fixture(scope="session")
def hf_moe(moe_path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32).eval()


@pytest.fixture
def quick_config(moe_path, tmp_path):
    """A few-second RL run: 1-digit arithmetic, short SFT, tiny batches (overrides per test)."""
    from minirl.training.train_config import TrainConfig

    def make(**changes):
        base = dict(model=str(moe_path), sft_steps=100, task="arithmetic", task_kwargs={"digits": 1}, n_train=8,
                    n_eval=4, prompts_per_step=2, group_size=4, max_new_tokens=4, steps=2, eval_every=0,
                    checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False)
        return TrainConfig(**{**base, **changes})

    return make
