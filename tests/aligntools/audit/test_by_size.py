"""The fingerprint by size (``aligntools.audit.by_size``): each candidate's own gap beside the recorded one.

The statistic is checked against a float64 transcription; the readings on draws whose true ratio is known;
the wiring (summary, report, replay) on records whose gap has bf16's size but not its per-token pattern,
which is what a bf16 engine computing in its own order leaves on a deep model.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

import aligntools
from aligntools.audit.by_size import BLOCK, by_size, sentence
from aligntools.audit.planted import plant
from aligntools.audit.precision import KNOBS
from aligntools.audit.report import render
from aligntools.audit.score import score
from aligntools.audit.state import Context, State
from aligntools.records import Record


def _layout(records: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    owner = torch.arange(records).repeat_interleave(tokens)
    return owner, torch.arange(tokens).repeat(records)


def test_ratio_and_interval_against_a_float64_transcription():
    owner, position = _layout(4, 40)  # 3 blocks a record (16, 16, 8 tokens): 12 blocks
    g = torch.Generator().manual_seed(0)
    engine, cand = (torch.randn(160, generator=g, dtype=torch.float64) for _ in range(2))
    found = by_size(engine, {"c": cand}, owner, position, seed=3)
    c = found["candidates"][0]
    assert np.isclose(found["recorded"], engine.abs().mean().item(), rtol=1e-12)
    assert np.isclose(c["gap"], cand.abs().mean().item(), rtol=1e-12)
    assert np.isclose(c["ratio"], (engine.abs().sum() / cand.abs().sum()).item(), rtol=1e-12)
    # the bootstrap, transcribed: blocks of BLOCK tokens of one record, resampled with replacement
    block = (owner * 3 + position // BLOCK).numpy()
    e = np.bincount(block, engine.abs().numpy())
    k = np.bincount(block, cand.abs().numpy())
    draws = np.random.default_rng(3).multinomial(12, np.full(12, 1 / 12), size=2000)
    low, high = np.quantile((draws @ e) / (draws @ k), [0.025, 0.975])
    assert np.isclose(c["low"], low, rtol=1e-12) and np.isclose(c["high"], high, rtol=1e-12)
    assert found["unit"] == f"blocks of {BLOCK} tokens, 12 blocks"


def test_readings_follow_the_true_ratio():
    owner, position = _layout(16, 64)
    g = torch.Generator().manual_seed(1)
    noise = lambda scale: scale * torch.randn(len(owner), generator=g, dtype=torch.float64)  # noqa: E731
    engine = noise(0.03)
    found = by_size(engine, {"same kind": noise(0.03), "a quarter": noise(0.0075), "four times": noise(0.12),
                             "overflows": torch.full_like(engine, float("nan"))}, owner, position)
    reading = {c["candidate"]: c["reading"] for c in found["candidates"]}
    assert reading == {"same kind": "consistent", "a quarter": "too small", "four times": "too large",
                       "overflows": "not finite"}
    assert [c["candidate"] for c in found["candidates"]][0] == "same kind"
    assert found["candidates"][-1]["candidate"] == "overflows"
    line = sentence(found)
    assert line.startswith("by size the gap matches same kind")
    assert line.endswith("too small to be all of it: a quarter; overflows overflows on this model")


def test_no_consistent_candidate_says_which_side_the_gap_lies():
    owner, position = _layout(16, 64)
    g = torch.Generator().manual_seed(2)
    engine = 0.03 * torch.randn(len(owner), generator=g, dtype=torch.float64)
    found = by_size(engine, {"small": engine / 8, "large": engine * 8}, owner, position)
    assert "no candidate's gap matches the recorded" in sentence(found)
    assert sentence(found).endswith("it is larger than that of small; it is smaller than that of large")


def _scored(ctx: Context, model) -> torch.Tensor:  # noqa: ANN001
    """Logits [N, V] of ``ctx``'s records under ``model``, one record at a time (the audit's own forward)."""
    return score(model, [r.prompt_ids for r in ctx.records], [r.completion_ids for r in ctx.records]).logits


def _bf16_sized_records(model, n: int = 6, new: int = 24) -> list[Record]:
    """Clean records whose logprobs are moved by the bf16 candidate's per-token moves, shuffled over
    the tokens: bf16's size, none of its per-token pattern (a bf16 engine rounding in its own order)."""
    clean = plant(model, "clean", n=n, new=new).records
    ctx = Context.of(clean, model, model.config.vocab_size)
    trainer = State(_scored(ctx, model), ctx.tokens, ctx.owner).logprobs()
    bf16 = copy.deepcopy(model)
    KNOBS["bf16"](bf16)
    move = State(_scored(ctx, bf16), ctx.tokens, ctx.owner).logprobs() - trainer
    shuffled = move[torch.randperm(len(move), generator=torch.Generator().manual_seed(0))]
    lp = (trainer + shuffled).clamp(max=0.0).tolist()
    out, k = [], 0
    for r in clean:
        out.append(Record(r.prompt_ids, r.completion_ids, lp[k:k + len(r.completion_ids)]))
        k += len(r.completion_ids)
    return out


def test_a_gap_of_bf16_size_without_its_pattern_is_read_by_size(llama_model):
    """What ``mlab audit`` prints when no candidate reproduces the engine token by token: the by-size
    reading, with the closest candidate minirl computes replayed; the report holds the table."""
    result = aligntools.audit(_bf16_sized_records(llama_model), llama_model)
    numeric = next(c for c in result.causes if c.name == "numeric")
    assert numeric.detail["fingerprint"][0][1] < 0.2, numeric.detail["fingerprint"]
    sized = numeric.detail["by_size"]
    reading = {c["candidate"]: c["reading"] for c in sized["candidates"]}
    assert reading["bf16"] == "consistent" and reading["fp16"] == "too small", sized
    assert "fingerprint: no precision choice reproduces these logprobs token by token" in result.summary()
    assert sentence(sized) in result.summary()
    replayed = numeric.detail["replay"]
    consistent = [c["candidate"] for c in sized["candidates"] if c["reading"] == "consistent"]
    assert replayed["candidate"] == next(c for c in consistent if c in ("bf16", "bf16 weights", "bf16 lm_head",
                                                                         "bf16 norms", "fp16")), (consistent, replayed)
    page = render(result)
    assert "Fingerprint by size" in page and "too small" in page and "<p>By size the gap matches" in page


def test_a_real_models_bf16_engine_is_read_by_size(zoo):
    """smollm2-135m (30 layers) scored by minirl's typical bf16 engine (fused ops, its own reduction order):
    after 30 layers its rounding is independent of a bf16 re-score's, and the user's ``mlab audit`` printed
    nothing about it (every share 0). By size, bf16 must read consistent, and fp16 and bf16 weights alone too
    small (three of the candidates: the wiring of all of them is the tiny-llama test's)."""
    import transformers

    from minirl import build_engine

    path = zoo("smollm2-135m")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    clean = plant(model, "clean", n=4, new=32).records  # the trainer's own samples: tokens a policy would draw
    engine = build_engine("minirl:typical,dtype=bfloat16", path)
    scored = engine.score([[*r.prompt_ids, *r.completion_ids] for r in clean])  # [len - 1] each
    records = [Record(r.prompt_ids, r.completion_ids, s[len(r.prompt_ids) - 1:].tolist())
               for r, s in zip(clean, scored)]
    ctx = Context.of(records, model, model.config.vocab_size)
    trainer = State(_scored(ctx, model), ctx.tokens, ctx.owner)
    deltas = {}
    for name in ("bf16", "fp16", "bf16 weights"):
        candidate = copy.deepcopy(model)
        KNOBS[name](candidate)
        deltas[name] = trainer.with_logits(_scored(ctx, candidate)).logprobs() - trainer.logprobs()
    found = by_size(ctx.engine - trainer.logprobs(), deltas, ctx.owner, ctx.position)
    reading = {c["candidate"]: c["reading"] for c in found["candidates"]}
    assert reading == {"bf16": "consistent", "fp16": "too small", "bf16 weights": "too small"}, found
