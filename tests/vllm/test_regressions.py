"""The defects the first run on real vLLM found, each pinned (tiny-qwen3-moe, float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools
from minirl.engines import load_hf
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm
NAME = "tiny-qwen3-moe"


@pytest.fixture(scope="module")
def caps(zoo, vllm_llm, prompt_ids):
    """(vLLM capture, transformers capture) of the same ids, both float32."""
    return (aligntools.capture(vllm_llm(NAME), prompt_ids, progress=False),
            aligntools.capture(load_hf(zoo(NAME), "float32"), prompt_ids, progress=False))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_vllm_shares_one_rotary_module_across_layers(vllm_llm):
    """Why q/k of L0..L2 were overwritten: every layer calls the same ``rotary_emb``."""
    from aligntools.adapters.vllm import VllmAdapter

    roles = VllmAdapter(vllm_llm(NAME)).roles
    assert len({id(lr.attn.rotary_emb) for lr in roles.layers}) == 1


@pytest.mark.parametrize("layer", range(4))
def test_q_k_of_every_layer_are_that_layers(caps, layer):
    cap, ref = caps
    for kind in ("q", "k"):
        site = f"L{layer}.{kind}"
        assert rel(cap.dataset[site].values, ref.dataset[site].values) < 1e-5, site


def test_routing_sites_come_from_vllms_router(caps):
    cap, ref = caps
    for layer in range(4):
        logits = torch.from_numpy(cap.dataset[f"L{layer}.router_logits"].values)  # [T, E]
        ids = np.sort(cap.dataset[f"L{layer}.topk_ids"].values, -1)  # [T, k]
        np.testing.assert_array_equal(ids, np.sort(logits.topk(ids.shape[1], -1).indices.numpy(), -1))
        np.testing.assert_array_equal(ids, np.sort(ref.dataset[f"L{layer}.topk_ids"].values, -1))
        w = cap.dataset[f"L{layer}.topk_weights"].values
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)  # renormalised, as the config says


def test_logits_logprobs_entropy_cover_every_prompt_position(caps, prompt_ids):
    cap, ref = caps
    n = prompt_ids.numel()
    for site in ("logits", "logprobs", "entropy"):
        assert cap.dataset[site].shape[0] == n, site
    lp = cap.dataset["logprobs"].values.reshape(prompt_ids.shape)  # [B, S]: NaN only at the last position
    assert np.isfinite(lp[:, :-1]).all()
    np.testing.assert_allclose(cap.dataset["logprobs"].values, ref.dataset["logprobs"].values, atol=1e-5)


def test_capture_works_on_an_llm_without_tokenizer(zoo, prompt_ids):
    from vllm import LLM

    from minirl.vllm.llm import keep_parallel_groups

    llm = LLM(model=str(zoo("tiny-llama")), enforce_eager=True, dtype="float32", skip_tokenizer_init=True)
    keep_parallel_groups(llm)  # collecting it must not break the module's other engines
    cap = aligntools.capture(llm, prompt_ids, sites="L*.resid_post,logprobs", progress=False)
    assert cap.dataset["logprobs"].shape[0] == prompt_ids.numel()


def test_dropping_a_vllm_capture_frees_it_at_once(vllm_llm, prompt_ids):
    """No reference cycle through the adapter's patched vLLM methods keeps a capture alive."""
    from tests.aligntools.tracker.test_memory_release import aligntools_garbage

    llm = vllm_llm(NAME)
    assert aligntools_garbage(lambda: aligntools.capture(llm, prompt_ids, progress=False)) == []
