"""The RL trainer's log-probs are the model's: ``log_softmax(model(ids).logits)`` to 1e-6 in fp32,
whatever the family applies after ``lm_head`` (Granite's scaling, Cohere's, Gemma 2's soft-cap)."""

from __future__ import annotations

import pytest
import torch

import kernels
from minirl.training.trainer_forward import trainer_logprobs
from tests.families.conftest import families


@pytest.mark.parametrize("model_type", families())
def test_trainer_logprobs_are_the_models(model_type, family_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(family_checkpoint(model_type), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (12, 9)]
    got = trainer_logprobs(model, seqs)
    for s, lp in zip(seqs, got):
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([s])).logits[0, :-1].float(), -1)
        ref = ref.gather(1, torch.tensor(s[1:])[:, None])[:, 0]
        assert (ref - lp).abs().max() <= 1e-6, model_type


def test_soft_capped_chunked_logprobs_match_autograd_of_the_formula():
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(7, 16, generator=gen, dtype=torch.float64) * 4).requires_grad_()
    w = torch.randn(33, 16, generator=gen, dtype=torch.float64).requires_grad_()
    t = torch.randint(0, 33, (7,), generator=gen)
    lp, ent = kernels.get("logprobs", "chunked", "torch")(h, w, t, softcap=5.0, temperature=0.7, chunk_size=3)
    logp = torch.log_softmax(torch.tanh(h @ w.T / 5.0) * 5.0 / 0.7, -1)
    ref_lp, ref_ent = logp.gather(1, t[:, None])[:, 0], -(logp.exp() * logp).sum(-1)
    assert torch.allclose(lp, ref_lp, atol=1e-12) and torch.allclose(ent, ref_ent, atol=1e-12)
    g = torch.autograd.grad((lp * 1.3 + ent * 0.4).sum(), (h, w))
    ref_g = torch.autograd.grad((ref_lp * 1.3 + ref_ent * 0.4).sum(), (h, w))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(g, ref_g))
    assert not torch.allclose(lp, torch.log_softmax(h @ w.T / 0.7, -1).gather(1, t[:, None])[:, 0])  # the cap bit


def test_the_triton_kernel_refuses_a_soft_cap_by_name():
    h, w, t = torch.zeros(2, 4), torch.zeros(8, 4), torch.zeros(2, dtype=torch.long)
    with pytest.raises(NotImplementedError, match="soft-cap.*impl='torch'"):
        kernels.get("logprobs", "chunked", "triton")(h, w, t, softcap=30.0)
