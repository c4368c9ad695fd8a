"""Planted faults on the zoo's tiny models: each cause is named first, with the planted size.

The records come from transformers' ``generate`` (its own logits processors, not the audit's
formulas); bounds come from the fit's stated precision (``FIT_RTOL``) or from the float64
distribution of the model itself (a truncation is identified up to the gap between tokens' masses).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import aligntools
from aligntools.audit.fit import FIT_RTOL
from aligntools.audit.planted import plant


@pytest.mark.parametrize("model", ["llama_model", "moe_model"])
def test_clean_records_audit_aligned(model, request):
    m = request.getfixturevalue(model)
    result = aligntools.audit(plant(m, "clean").records, m)
    assert result.verdict == "aligned" and result.causes == ()
    assert result.gap <= result.limit


@pytest.mark.parametrize("fault", ["temperature", "top_k", "repetition_penalty", "token_shift", "bos_dropped",
                                   "stale_weights", "temperature+top_p"])
def test_semantic_fault_named_with_its_size(llama_model, fault):
    planted = plant(llama_model, fault)
    result = aligntools.audit(planted.records, llama_model, old=planted.old)
    assert result.verdict == "misaligned"
    top = result.causes[0]
    assert top.name == planted.cause, result.summary()
    if isinstance(planted.truth, float):
        assert abs(top.estimate / planted.truth - 1) <= 2 * FIT_RTOL, result.summary()
    else:
        assert top.estimate == planted.truth, result.summary()
    assert [c.share for c in result.causes] == sorted((c.share for c in result.causes), reverse=True)
    if fault != "token_shift":  # a shifted list leaves each record's last logprob unexplained
        # the fitted causes reproduce the engine to the noise floor: nothing is left for numeric
        assert "numeric" not in [c.name for c in result.causes], result.summary()
        assert math.isclose(sum(c.share for c in result.causes), 1.0, abs_tol=result.limit / result.gap)


def _kept_interval(model, records, criterion):
    """(lo, hi]: the parameter values that keep, at every recorded position, the same tokens as the
    planted one did; ``criterion(sorted_probs)`` -> (per-position lower bound, upper bound) [N]."""
    los, his = [], []
    model64 = copy.deepcopy(model).double()
    for r in records:
        ids = torch.tensor([list(r.prompt_ids) + list(r.completion_ids)[:-1]])
        with torch.inference_mode():
            logits = model64(input_ids=ids).logits[0, len(r.prompt_ids) - 1:]
        s = logits.softmax(-1).sort(-1, descending=True).values  # [C, V] float64
        lo, hi = criterion(s)
        los.append(lo)
        his.append(hi)
    return float(torch.cat(los).max()), float(torch.cat(his).min())


def test_top_p_estimate_inside_the_identifiable_interval(llama_model):
    planted = plant(llama_model, "top_p")
    result = aligntools.audit(planted.records, llama_model)
    assert result.causes[0].name == "top_p"

    def interval(s):  # kept while the mass before a token is < p: last kept index n - 1
        cum = s.cumsum(-1)
        n = (cum - s < planted.truth).sum(-1)  # [C]
        return (cum - s).gather(-1, (n - 1)[:, None])[:, 0], cum.gather(-1, (n - 1)[:, None])[:, 0]

    lo, hi = _kept_interval(llama_model, planted.records, interval)
    assert lo < result.causes[0].estimate <= hi, (lo, hi, result.summary())


def test_min_p_estimate_inside_the_identifiable_interval(llama_model):
    planted = plant(llama_model, "min_p")
    result = aligntools.audit(planted.records, llama_model)
    assert result.causes[0].name == "min_p"

    def interval(s):  # kept when p_i >= m * p_max: m in (ratio of the first dropped, ratio of the last kept]
        ratio = s / s[:, :1]
        n = (ratio >= planted.truth).sum(-1)
        return ratio.gather(-1, n[:, None].clamp(max=s.shape[1] - 1))[:, 0], ratio.gather(-1, (n - 1)[:, None])[:, 0]

    lo, hi = _kept_interval(llama_model, planted.records, interval)
    assert lo < result.causes[0].estimate <= hi, (lo, hi, result.summary())


@pytest.mark.parametrize("model", ["llama_model", "moe_model"])
def test_bf16_engine_is_numeric(model, request):
    m = request.getfixturevalue(model)
    result = aligntools.audit(plant(m, "bf16").records, m)
    assert [c.name for c in result.causes] == ["numeric"], result.summary()
    assert result.causes[0].share == 1.0 and result.causes[0].estimate == pytest.approx(result.gap)
    buckets = result.causes[0].detail
    assert sum(buckets[k]["tokens"] for k in buckets if k.startswith("p[")) == result.tokens


def test_routing_flips_named_and_counted(moe_model):
    rate = 0.1
    planted = plant(moe_model, "routing")
    result = aligntools.audit(planted.records, moe_model)
    assert result.causes[0].name == "routing", result.summary()
    layers = moe_model.config.num_hidden_layers
    # a token flips in >= 1 layer with probability 1 - (1 - rate)^layers; allow 4 binomial sigmas
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) - 1 for r in planted.records)
    expected = 1 - (1 - rate) ** layers
    sigma = math.sqrt(expected * (1 - expected) / tokens)
    assert abs(result.causes[0].estimate - expected) <= 4 * sigma
    per_layer = np.array(result.routing["flip_rate_per_layer"])
    assert per_layer.shape == (layers,)
    assert np.all(np.abs(per_layer - rate) <= 4 * math.sqrt(rate * (1 - rate) / tokens))


def test_bf16_moe_with_recorded_experts_is_numeric_first_and_routing_partial(moe_model):
    """A bf16 engine's flips are a symptom: replaying them removes part of the gap (routing's share),
    numeric keeps the rest, and the shares add up to at most the whole gap."""
    from aligntools.audit.score import score
    from aligntools.records import Record

    records = plant(moe_model, "bf16").records
    engine = copy.deepcopy(moe_model).to(torch.bfloat16)
    routed = score(engine, [r.prompt_ids for r in records], [r.completion_ids for r in records]).routing
    records = [Record(r.prompt_ids, r.completion_ids, r.logprobs, routed_experts=e) for r, e in zip(records, routed)]
    result = aligntools.audit(records, moe_model)
    names = [c.name for c in result.causes]
    assert result.routing["tokens_with_flip"] > 0, "no bf16 flips: the case this test is about did not arise"
    assert names[0] == "numeric" and "routing" in names, result.summary()
    assert all(c.share >= 0 for c in result.causes)
    assert sum(c.share for c in result.causes) <= 1 + 1e-12


@pytest.mark.parametrize("model,fault", [("llama_model", "repetition_penalty"), ("llama_model", "bos_dropped"),
                                         ("llama_model", "stale_weights"), ("moe_model", "routing")])
def test_causes_fitted_on_the_first_records_apply_to_all(model, fault, request, monkeypatch):
    """With a fit budget of two records' tokens, the causes fitted there explain every record: the
    planted cause takes the whole gap, and routing counts the flips of all records."""
    import aligntools.audit.run

    m = request.getfixturevalue(model)
    planted = plant(m, fault)
    monkeypatch.setattr(aligntools.audit.run, "FIT_TOKENS", 2 * len(planted.records[0].completion_ids))
    result = aligntools.audit(planted.records, m, old=planted.old)
    top = result.causes[0]
    assert top.name == planted.cause and [c.name for c in result.causes] == [planted.cause], result.summary()
    assert math.isclose(top.share, 1.0, abs_tol=result.limit / result.gap)
    if fault == "routing":
        assert top.estimate == result.routing["tokens_with_flip"]


def test_a_chat_template_the_engine_applied_alone_is_named(llama, tmp_path):
    """The engine rendered the chat template (as vLLM's chat endpoint does) and the records keep the raw
    prompt: ``prompt_mismatch`` with ``chat_template``. The zoo's tiny models ship no template, so this
    copy of tiny-llama gets one; the real checkpoints (smollm2, Gemma 3) carry theirs and take this path."""
    import shutil

    import transformers

    from aligntools.audit.planted import _prompts, generate
    from aligntools.records import Record

    path = shutil.copytree(llama, tmp_path / "tiny-llama-chat")
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}<user> {{ m.content }} </user>{% endfor %}{% if add_generation_prompt %} <bot>{% endif %}")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    records = []
    for i, prompt in enumerate(_prompts(model, 4, 8, seed=0).tolist()):
        chat = [{"role": "user", "content": tok.decode(prompt, skip_special_tokens=True)}]
        seen = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        completion, lp = generate(model, torch.tensor([seen]), 16, seed=i)
        records.append(Record(tuple(prompt), tuple(completion[0].tolist()), tuple(lp[0].tolist())))
    result = aligntools.audit(records, model)
    top = result.causes[0]
    assert (top.name, top.estimate) == ("prompt_mismatch", "chat_template"), result.summary()
    assert math.isclose(top.share, 1.0, abs_tol=result.limit / result.gap), result.summary()
    # another template in the same files: the audit reads it (the tokenizer is cached per version of its files)
    (path / "chat_template.jinja").write_text("{% for m in messages %}[[ {{ m.content }} ]]{% endfor %}")
    again = aligntools.audit(records, model).causes[0]
    assert not (again.name == "prompt_mismatch" and again.share > 0.5), again
