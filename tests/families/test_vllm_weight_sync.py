"""Weight sync hands vLLM's loader checkpoint names: tiny Mixtral (transformers 5 fuses its
``block_sparse_moe`` experts in memory) and tied Gemma 2 (vLLM's model has no ``lm_head``)
score like the updated transformers model after one sync (``MinirlVllm.load_weights`` does
this after each RL update)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from minirl.engines import load_hf
from minirl.vllm.llm import checkpoint_state, sync_weights
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm


@pytest.mark.parametrize("model_type", ["mixtral", pytest.param("gemma2", marks=pytest.mark.slow)])
def test_sync_of_an_updated_model_scores_like_it(model_type, family_checkpoint):
    from vllm import SamplingParams

    from minirl.vllm.llm import create_llm

    path = family_checkpoint(model_type)
    model = load_hf(path, "float32")
    names = set(checkpoint_state(model))
    assert any("lm_head" in n for n in names) == (not model.config.tie_word_embeddings)
    assert model_type != "mixtral" or any("block_sparse_moe.experts.0.w1" in n for n in names)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # an "RL update"
    ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits.float(), -1)[:, :-1].gather(2, ids[:, 1:, None])[..., 0].numpy()
    llm = create_llm(path, "float32", max_model_len=64)
    sync_weights(llm, checkpoint_state(model))
    out = llm.generate([{"prompt_token_ids": r} for r in ids.tolist()], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)
    got = np.array([[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]] for o in out])
    del llm
    gc.collect()
    assert np.abs(got - ref).max() < 1e-4
