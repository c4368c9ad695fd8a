"""HF adapter sites against transformers' own outputs (independent ground truth)."""

from __future__ import annotations

import pytest
import torch

import aligntools

DENSE_AND_MOE = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral"]


def site(cap, name: str) -> torch.Tensor:
    return torch.from_numpy(cap.dataset[name].values)


@pytest.mark.parametrize("name", DENSE_AND_MOE)
def test_residual_stream_and_outputs_equal_transformers(hf_model, ids, name):
    model = hf_model(name)
    cap = aligntools.capture(model, ids)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    hs = [h.reshape(-1, h.shape[-1]) for h in out.hidden_states]  # flat [B*S, H], request-major
    n = model.config.num_hidden_layers
    assert torch.equal(site(cap, "embed"), hs[0])
    for i in range(n - 1):
        assert torch.equal(site(cap, f"L{i}.resid_post"), hs[i + 1]), i
    assert torch.equal(site(cap, "final_norm"), hs[-1])
    assert torch.equal(site(cap, "logits"), out.logits.reshape(-1, out.logits.shape[-1]))
    # the last layer's resid_post (HF reports it after the final norm): an independent hook
    seen = []
    handle = model.model.layers[-1].register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():
        model(ids)
    handle.remove()
    assert torch.equal(site(cap, f"L{n - 1}.resid_post"), seen[0].reshape(-1, seen[0].shape[-1]))
    assert list(cap.dataset["request"].values) == [0] * 7 + [1] * 7
    assert list(cap.dataset["position"].values) == list(range(7)) * 2
    assert torch.equal(torch.from_numpy(cap.dataset["token_id"].values), ids.reshape(-1))


def test_residual_algebra(hf_model, ids):
    """resid_mid = previous residual + attn_out and resid_post = resid_mid + mlp_out, bitwise."""
    cap = aligntools.capture(hf_model("tiny-qwen3"), ids)
    prev = site(cap, "embed")
    for i in range(4):
        assert torch.equal(site(cap, f"L{i}.resid_mid"), prev + site(cap, f"L{i}.attn_out"))
        prev = site(cap, f"L{i}.resid_post")
        assert torch.equal(prev, site(cap, f"L{i}.resid_mid") + site(cap, f"L{i}.mlp_out"))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style RoPE written out here: x [T, heads, D], cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_q_k_after_rope_equal_recomputation(hf_model, ids, name):
    model = hf_model(name)
    cap = aligntools.capture(model, ids, sites="L1.q,L1.k,L1.attn_norm")
    attn = model.model.layers[1].self_attn
    x = site(cap, "L1.attn_norm")  # [T, H]
    positions = torch.arange(7).repeat(2)
    cos, sin = model.model.rotary_emb(x[None], positions[None])  # [1, T, D]
    d = attn.head_dim
    with torch.no_grad():
        q = attn.q_proj(x).view(len(x), -1, d)
        k = attn.k_proj(x).view(len(x), -1, d)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = _rope(q, cos[0], sin[0]).flatten(1), _rope(k, cos[0], sin[0]).flatten(1)
    torch.testing.assert_close(site(cap, "L1.q"), q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(site(cap, "L1.k"), k, rtol=1e-6, atol=1e-6)


def _routing_truth(model, ids):
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    return out.router_logits  # per MoE layer: [T, E]


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-mixtral", "olmoe"])
def test_routing_equals_topk_of_router_logits(hf_model, olmoe, ids, name):
    model = olmoe if name == "olmoe" else hf_model(name)
    cap = aligntools.capture(model, ids, sites="L*.router_logits,L*.topk_*")
    truth = _routing_truth(model, ids)
    k = model.config.num_experts_per_tok
    renorm = getattr(model.config, "norm_topk_prob", True)
    assert len(truth) == model.config.num_hidden_layers
    for i, logits in enumerate(truth):
        assert torch.equal(site(cap, f"L{i}.router_logits"), logits)
        probs = torch.softmax(logits.float(), -1)
        w, top = torch.topk(probs, k, -1)
        assert torch.equal(site(cap, f"L{i}.topk_ids"), top)
        if renorm:
            w = w / w.sum(-1, keepdim=True)
        torch.testing.assert_close(site(cap, f"L{i}.topk_weights"), w, rtol=1e-6, atol=1e-7)
    assert cap.dataset[f"L0.topk_ids"].dtype == "int64"


def test_logprobs_and_entropy_from_logits(hf_model, ids):
    model = hf_model("tiny-llama")
    cap = aligntools.capture(model, ids, sites="logprobs,entropy")
    assert cap.sites == ["logprobs", "entropy"]  # logits were needed but not kept
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double(), -1)  # [B, S, V]
    expect = logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # [B, S-1]
    lp = site(cap, "logprobs").view(2, 7).double()
    torch.testing.assert_close(lp[:, :-1], expect, rtol=1e-5, atol=1e-5)
    assert torch.isnan(lp[:, -1]).all()  # next token unknown at the last prompt position
    ent = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(site(cap, "entropy").view(2, 7).double(), ent, rtol=1e-5, atol=1e-5)


def test_left_padding_rows_are_dropped(hf_model):
    model = hf_model("tiny-qwen3")
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with aligntools.Tracker(model, sites="L0.resid_post,logits") as t, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    ds = t.capture.dataset
    assert list(ds["position"].values) == [0, 1, 2, 0, 1, 2, 3, 4]
    assert list(ds["token_id"].values) == [11, 12, 13, 21, 22, 23, 24, 25]
    alone = aligntools.capture(model, ids[:1, 2:], sites="logits")
    torch.testing.assert_close(site(t.capture, "logits")[:3], site(alone, "logits"), rtol=1e-5, atol=1e-5)


def test_generate_decode_steps_match_prefill(hf_model):
    """HF generate under a Tracker: decode steps are labelled, and equal a prefill of the result."""
    model = hf_model("tiny-llama")
    prompt = torch.tensor([[5, 17, 42, 9]])
    with aligntools.Tracker(model, sites="L*.resid_post,logits,logprobs") as t, torch.no_grad():
        seq = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    ds = t.capture.dataset
    assert list(ds["step"].values) == [0, 0, 0, 0, 1, 2, 3]
    assert list(ds["position"].values) == list(range(7))
    full = aligntools.capture(model, seq[:, :7], sites="L*.resid_post,logits,logprobs")
    for s in ("L0.resid_post", "L3.resid_post"):
        torch.testing.assert_close(site(t.capture, s), site(full, s), rtol=1e-5, atol=1e-5)
    # generate computes logits only at the last prompt position (logits_to_keep=1): NaN before
    assert torch.isnan(site(t.capture, "logits")[:3]).all()
    for s in ("logits", "logprobs"):
        torch.testing.assert_close(site(t.capture, s)[3:], site(full, s)[3:], rtol=1e-5, atol=1e-5, equal_nan=True)
    # the last prompt position's logprob is that of the first generated token
    assert not torch.isnan(site(t.capture, "logprobs")[3])
