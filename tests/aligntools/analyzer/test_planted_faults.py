"""Planted faults on real zoo models, captured with the real Tracker.

Each test patches exactly one module of a copy of the model (with the ``kernels`` variant
an inference engine would use) and checks that first divergence and diagnosis name it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import aligntools
import kernels
from aligntools.gates.accuracy import accuracy_gate


def load(zoo, name: str) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(zoo(name), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llama(zoo):
    """(model, ids [2, 16], capture of the unpatched model)."""
    model = load(zoo, "tiny-llama")
    ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    return model, ids, aligntools.capture(model, ids)


def patched(model, fn):
    m = copy.deepcopy(model)
    fn(m)
    return m


def norm_kernel(norm, variant: str) -> None:
    f = kernels.get("rmsnorm", variant)
    norm.forward = lambda x: f(x, norm.weight, norm.variance_epsilon)


def rope_bf16_table(attn) -> None:
    """cos/sin rounded to bf16 before use: a bf16 cos/sin cache (vLLM cos_sin_cache)."""
    forward = attn.forward

    def fwd(*args, position_embeddings, **kwargs):
        cos, sin = position_embeddings
        return forward(*args, position_embeddings=(cos.bfloat16().float(), sin.bfloat16().float()), **kwargs)

    attn.forward = fwd


def router_bf16_unstable(gate) -> None:
    """Router GEMM and scores in bf16, ties broken by batch row (kernels 'unstable' top-k)."""
    topk = kernels.get("router_topk", "unstable")

    def fwd(h):
        h = h.reshape(-1, gate.hidden_dim)
        logits = F.linear(h.bfloat16(), gate.weight.bfloat16()).float()
        ids, w = topk(logits, gate.top_k, compute_dtype=torch.bfloat16, renormalize=gate.norm_topk_prob)
        return logits, w.to(logits.dtype), ids

    gate.forward = fwd


def diagnose(model, ids, base, fn):
    cmp = aligntools.compare(base, aligntools.capture(patched(model, fn), ids))
    return cmp, cmp.first_divergence, [(f.cause, f.site) for f in cmp.diagnosis]


def test_identical_runs_report_zero_error_and_pass(llama):
    model, ids, base = llama
    cmp = aligntools.compare(base, aligntools.capture(model, ids))
    assert cmp.passes and cmp.first_divergence is None and cmp.diagnosis == []
    assert cmp.table["rel_l2"].max() == 0 and cmp.table.loc["logits", "top1_agree"] == 1


def test_layer2_rmsnorm_in_bf16(llama):
    cmp, fd, found = diagnose(*llama, lambda m: norm_kernel(m.model.layers[2].input_layernorm, "bf16_compute"))
    assert fd.site == "L2.attn_norm" and fd.factor == float("inf")
    assert found[0] == ("rmsnorm_precision", "L2.attn_norm")
    assert not cmp.passes and cmp.failures[0] == "L2.attn_norm"


def test_stats_mode_capture_finds_the_same_fault(llama):
    """A stats-only capture of the faulty run against the full tensor capture: lower bounds."""
    model, ids, base = llama
    faulty = patched(model, lambda m: norm_kernel(m.model.layers[2].input_layernorm, "bf16_compute"))
    cmp = aligntools.compare(base, aligntools.capture(faulty, ids, mode="stats"))
    assert set(cmp.table["basis"]) == {"stats"} and cmp.first_divergence.site == "L2.attn_norm"
    assert cmp.table.loc["L1.resid_post", "exact"] == 1.0 and cmp.table.loc["L2.attn_norm", "exact"] == 0.0


def test_layer2_rmsnorm_eps(llama):
    def eps(m):
        m.model.layers[2].input_layernorm.variance_epsilon = 1e-2

    _, fd, found = diagnose(*llama, eps)
    assert fd.site == "L2.attn_norm" and found[0] == ("rmsnorm_eps", "L2.attn_norm")


def test_layer1_rope_bf16_table(llama):
    cmp, fd, found = diagnose(*llama, lambda m: rope_bf16_table(m.model.layers[1].self_attn))
    assert fd.site == "L1.q" and found[0] == ("rope", "L1.q")
    assert cmp.table.loc["L1.v", "rel_l2"] == 0 < cmp.table.loc["L1.k", "rel_l2"]


def test_lm_head_bf16(llama):
    def bf16_head(m):
        head = m.lm_head
        head.forward = lambda x: F.linear(x.bfloat16(), head.weight.bfloat16()).float()

    cmp, fd, found = diagnose(*llama, bf16_head)
    assert fd.site == "logits" and found[0] == ("lm_head_precision", "logits")
    assert cmp.table.loc["logits", "dlogprob_max"] > 0


def test_router_bf16_with_unstable_topk(zoo):
    model = load(zoo, "tiny-qwen3-moe")
    ids = torch.randint(3, model.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0))
    base = aligntools.capture(model, ids)
    cmp, fd, found = diagnose(model, ids, base, lambda m: router_bf16_unstable(m.model.layers[3].mlp.gate))
    assert fd.site == "L3.router_logits" and found[0] == ("router_precision", "L3.router_logits")
    flips = cmp.routing.loc[3]
    assert flips["set_flip"] > 0, "no top-k flip at L3: the zoo model changed; pick more tokens"
    assert ("unstable_topk", "L3.topk_ids") in found and flips["margin_flipped"] < 0.1 * flips["margin_all"]


def test_prefill_vs_decode_capture_line_up(llama):
    model, ids, _ = llama
    with aligntools.Tracker(model) as t:
        out = model.generate(ids[:, :10], max_new_tokens=5, do_sample=False, pad_token_id=0)
    prefill = aligntools.capture(model, out[:, :-1])  # the last sampled token is never an input
    cmp = aligntools.compare(prefill, t.capture)
    assert cmp.alignment.tokens["step_b"].max() == 4 and cmp.first_divergence is None and cmp.passes
    assert cmp.table.loc["logits", "missing_b"] > 0  # generate computes logits for the last position only
    assert cmp.table.loc["logits", "top1_agree"] == 1.0


def test_accuracy_gate_on_rmsnorm_kernels(llama):
    model, ids, base = llama
    reference = aligntools.capture(copy.deepcopy(model).double(), ids)

    def everywhere(variant):
        def fn(m):
            for layer in m.model.layers:
                norm_kernel(layer.input_layernorm, variant)
                norm_kernel(layer.post_attention_layernorm, variant)
        return aligntools.capture(patched(model, fn), ids)

    assert accuracy_gate(everywhere("reference"), base, reference).passes
    degraded = accuracy_gate(everywhere("bf16_compute"), base, reference)
    assert not degraded.passes and degraded.failures[0] == "L0.attn_norm"
