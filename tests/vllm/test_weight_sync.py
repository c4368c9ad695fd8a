"""Weight sync into a running LLM: afterwards it scores exactly like a fresh LLM on the new
checkpoint (what the RL trainer relies on after each update)."""

from __future__ import annotations

import shutil

import numpy as np
import torch

from minirl.vllm.llm import sync_weights
from minirl.engines import load_hf
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm
NAME = "tiny-qwen3-moe"


def prompt_logprobs(llm, ids: torch.Tensor) -> np.ndarray:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": r} for r in ids.tolist()], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)
    return np.array([[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]] for o in out])  # [B, S-1]


def test_synced_llm_scores_like_a_fresh_llm_on_the_new_checkpoint(zoo, vllm_llm, prompt_ids, tmp_path):
    model = load_hf(zoo(NAME), "float32")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # an "RL update"
    new = tmp_path / "updated"
    shutil.copytree(zoo(NAME), new)
    model.save_pretrained(new)
    running = vllm_llm(NAME)
    before = prompt_logprobs(running, prompt_ids)
    sync_weights(running, model.state_dict())
    after = prompt_logprobs(running, prompt_ids)
    fresh = prompt_logprobs(vllm_llm(new), prompt_ids)
    assert np.abs(before - fresh).mean() > 1e-3  # the update changed the scores
    np.testing.assert_array_equal(after, fresh)  # MoE included: the CPU experts are repacked
    sync_weights(running, zoo(NAME))  # back from a checkpoint directory
    np.testing.assert_array_equal(prompt_logprobs(running, prompt_ids), before)
