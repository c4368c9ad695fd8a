"""Cause ``quantized_layers`` and the numeric fingerprint on the zoo's tiny models.

The planted engines are built apart from the audit's code: the quantized one picks its MLP matrices by
name (the audit picks layer groups by role), the bf16-lm_head one replaces lm_head by its own bf16 module
(the fingerprint casts a copy with hooks); both generate through transformers' ``generate``.
"""

from __future__ import annotations

import math

import pytest
import torch

import aligntools
from aligntools.audit.precision import layer_groups, numeric_detail, quantized
from aligntools.audit.planted import plant
from aligntools.audit.score import score
from aligntools.audit.state import Context, State


@pytest.mark.parametrize("model", ["llama_model", "moe_model"])
def test_planted_quantized_layers_named_with_their_group(model, request):
    m = request.getfixturevalue(model)
    planted = plant(m, "quantized_layers", n=4)
    result = aligntools.audit(planted.records, m)
    top = result.causes[0]
    assert (top.name, top.estimate) == ("quantized_layers", "fp8_e4m3 on mlp"), result.summary()
    # the right rounding reproduces the engine: nothing is left for numeric
    assert [c.name for c in result.causes] == ["quantized_layers"], result.summary()
    assert math.isclose(top.share, 1.0, abs_tol=result.limit / result.gap)


def test_clean_and_bf16_engines_not_named_quantized_layers(llama_model):
    assert aligntools.audit(plant(llama_model, "clean", n=4).records, llama_model).causes == ()
    result = aligntools.audit(plant(llama_model, "bf16", n=4).records, llama_model)
    assert [c.name for c in result.causes] == ["numeric"], result.summary()


def test_fingerprint_ranks_bf16_lm_head_first(llama_model):
    shares = aligntools.audit.fingerprint(plant(llama_model, "bf16_lm_head", n=4).records, llama_model)
    (first, share), (_, second) = shares[:2]
    # the engine's lm_head is the candidate's up to fp32 decode-vs-prefill noise in its input
    assert first == "bf16 lm_head" and share > 0.95 and second < 0.9 * share, shares
    assert all(0.0 <= s <= 1.0 for _, s in shares)


def test_numeric_detail_replays_the_best_candidate_to_its_first_divergent_site(llama_model):
    records = plant(llama_model, "bf16_lm_head", n=2).records
    ctx = Context.of(records, llama_model, llama_model.config.vocab_size)
    logits = score(llama_model, [r.prompt_ids for r in records], [r.completion_ids for r in records]).logits
    detail = numeric_detail(ctx, State(logits, ctx.tokens, ctx.owner))
    assert detail["fingerprint"][0][0] == "bf16 lm_head", detail
    # minirl's Knobs(lm_head_dtype="bfloat16") leaves every site before the logits at fp32's noise
    assert detail["replay"]["first_divergence"] == "logits", detail["replay"]


def test_layer_groups_by_role(moe_model):
    groups = layer_groups(moe_model)
    assert set(groups["linear"]) == set(groups["attention"]) | set(groups["mlp"])
    assert set(groups["all"]) == set(groups["linear"]) | {"lm_head.weight", "model.embed_tokens.weight"}
    assert groups["lm_head"] == ["lm_head.weight"] and groups["embeddings"] == ["model.embed_tokens.weight"]
    assert "model.layers.0.mlp.experts.gate_up_proj" in groups["mlp"]
    assert not any(".gate.weight" in n or "norm" in n for n in groups["linear"])  # router, norms: kept
    layers = moe_model.config.num_hidden_layers
    assert [g for g in groups if g.startswith("layer")] == [f"layer {i}" for i in range(layers)]


def _e4m3_64(y: torch.Tensor) -> torch.Tensor:
    """Round float64 ``y`` to float8 e4m3fn (3 mantissa bits, min normal 2^-6, max 448), half to even."""
    y = y.clamp(-448.0, 448.0)
    exp = torch.floor(torch.log2(y.abs().clamp_min(2.0 ** -6)))  # subnormals share 2^-6's spacing
    step = 2.0 ** (exp - 3)
    return torch.round(y / step) * step  # torch.round: half to even


def test_quantized_is_per_channel_fp8_e4m3_in_float64(llama_model):
    name = "model.layers.0.mlp.down_proj.weight"
    got = quantized(llama_model, [name], "fp8_e4m3")[name]
    w = llama_model.get_parameter(name).detach().double()  # [out, in]
    scale = w.abs().amax(-1, keepdim=True) / 448.0
    torch.testing.assert_close(got.double(), _e4m3_64(w / scale) * scale, rtol=1e-6, atol=0.0)


def test_the_verdict_names_the_fingerprint_of_a_numeric_gap(llama_model):
    """``mlab audit``'s lines: a bf16 lm_head engine's numeric gap says which precision explains it, with
    its share as the detail holds it, and where the replay first diverges."""
    result = aligntools.audit(plant(llama_model, "bf16_lm_head", n=4).records, llama_model)
    numeric = next(c for c in result.causes if c.name == "numeric")
    name, share = numeric.detail["fingerprint"][0]
    assert f"fingerprint: {name} explains {share:.0%} of this gap" in result.summary()
    assert name == "bf16 lm_head" and numeric.detail["replay"]["first_divergence"] == "logits"
    assert "replayed through minirl as bf16 lm_head, the first divergent site is logits" in result.summary()


def test_every_candidate_runs_on_a_tied_gemma3_and_casts_only_its_part(zoo_root, zoo):
    """smollm2 and Gemma 3 tie lm_head to the embedding table: ``bf16 lm_head`` must round the head only
    (it rounded the table too, and on Gemma 3, whose norms return their input's dtype, fed bf16 into fp32
    layers: ``mlab audit`` crashed on gemma3-270m's records)."""
    import copy

    import transformers

    from aligntools.audit.precision import KNOBS
    from tests.families import tiny

    path = tiny.build("gemma3_text", zoo_root / "families" / "gemma3_text", tokenizer_from=zoo("tiny-qwen3"))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied, as the real checkpoint
    ids = torch.tensor([[2, 17, 42, 99, 7]])
    for name, apply in KNOBS.items():
        engine = copy.deepcopy(model)
        apply(engine)
        with torch.inference_mode():
            assert torch.isfinite(engine(input_ids=ids).logits).all(), name
    head = copy.deepcopy(model)
    KNOBS["bf16 lm_head"](head)
    assert head.lm_head.weight.dtype == torch.bfloat16
    table = head.get_input_embeddings().weight
    assert table.dtype == torch.float32 and torch.equal(table, model.get_input_embeddings().weight)


@pytest.mark.parametrize("model", ["llama_model", "moe_model"])
def test_a_per_layer_screen_from_its_layer_has_the_bits_of_a_whole_forward(model, request):
    """The per-layer screens skip the layers before the one they change (those return the trainer's kept
    outputs): the screened logprobs must be the whole forward's, bit for bit, or the screen ranks other
    numbers than it claims."""
    from aligntools.audit.precision import _Screen

    m = request.getfixturevalue(model)
    records = plant(m, "clean", n=3, new=8).records
    ctx = Context.of(records, m, m.config.vocab_size)
    screen = _Screen(ctx, State(score(m, [r.prompt_ids for r in records],
                                      [r.completion_ids for r in records]).logits, ctx.tokens, ctx.owner))
    groups = layer_groups(m)
    last = m.config.num_hidden_layers - 1
    weights = quantized(m, groups[f"layer {last}"], "int8")
    skipped, whole = screen(weights, from_layer=last), screen(weights)
    assert torch.equal(skipped, whole)
    assert not torch.equal(whole, screen.trainer)  # the candidate did change the last layer
    assert torch.equal(screen({}, from_layer=last), screen.trainer)
    assert not any("forward" in vars(layer) for layer in screen.layers)  # the layers' own forwards are back


def test_padded_groups_keep_the_budget_and_the_order(llama_model, monkeypatch):
    """The fingerprint scores its records in right-padded batches of at most ``BATCH_ELEMENTS`` logits:
    each group within it (or one record alone), every record once, in order."""
    from aligntools.audit import precision
    from aligntools.records import Record

    vocab = llama_model.config.vocab_size
    records = [Record((1,) * p, (5,) * c, (-1.0,) * c) for p, c in [(3, 4), (9, 2), (2, 7), (4, 4), (30, 5)]]
    monkeypatch.setattr(precision, "BATCH_ELEMENTS", 16 * vocab)
    groups = precision._Padded.groups(records, vocab)
    # rows a group pads to: its longest sequence less its shortest prompt; 2 x 8, 2 x 7, then the long one alone
    assert [len(g.rows) for g in groups] == [2, 2, 1]
    for g in groups:
        assert len(g.rows) == 1 or g.ids.shape[0] * (g.ids.shape[1] - g.start) * vocab <= 16 * vocab
    flat = [row for g in groups for row in g.ids.tolist()]
    assert [len([t for t in row if t]) for row in flat] == [p + c - 1 for p, c in [(3, 4), (9, 2), (2, 7), (4, 4), (30, 5)]]


@pytest.mark.parametrize("model", ["llama_model", "moe_model"])
def test_padded_logprobs_are_as_close_to_float64_as_one_record_at_a_time(model, request):
    """A right-padded batch is another fp32 path (other GEMM shapes, a padding mask), not another answer:
    its logprobs stay as close to the float64 model's as ``score``'s one record at a time (4x its worst
    error, the fp32 noise the floor measures), on records of unequal prompt and completion lengths."""
    from aligntools.audit.precision import _Padded
    from aligntools.audit.logits import token_logprob
    from aligntools.audit.score import load_model

    m = request.getfixturevalue(model)
    recs = plant(m, "clean", n=2, new=10).records + plant(m, "clean", n=2, prompt_len=5, new=6, seed=1).records
    prompts, completions = [r.prompt_ids for r in recs], [r.completion_ids for r in recs]
    tokens = torch.tensor([t for c in completions for t in c])
    lp64 = score(load_model(m, torch.float64), prompts, completions).rows.lp
    one = score(m, prompts, completions).rows.lp
    batched = token_logprob(torch.cat([b.logits(m) for b in _Padded.groups(recs, m.config.vocab_size)]), tokens)
    assert (batched.double() - lp64).abs().max() <= 4 * (one.double() - lp64).abs().max() + 1e-7
