"""The fast paths of the audit against the straightforward ones: logits held as hidden states and
projected in chunks vs held whole, the sparse penalty loss and the fp32 temperature loss vs the dense
float64 processors. Bounds come from the rounding each path adds."""

from __future__ import annotations

import math

import pytest
import torch

import aligntools
import aligntools.audit.score
import aligntools.audit.logits
from aligntools.audit.fit import FIT_RTOL
from aligntools.audit.planted import plant
from aligntools.audit.sampling import _penalised, _penalty_loss, _tempered_loss
from aligntools.audit.score import score
from aligntools.audit.state import Context, State, gap
from aligntools.records import Record


def _projection_error(model, records) -> float:
    """Max |held logit - re-projected logit|: each is an H-term fp32 dot product, within H * eps * (|h| @ |W|^T)
    of the exact one, so they differ by at most twice that."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aligntools.audit.score, "HOLD_ELEMENTS", 0)
        hidden = score(model, [r.prompt_ids for r in records], [r.completion_ids for r in records]).rows.source
    w = model.get_output_embeddings().weight.detach()
    return float(2 * hidden.shape[1] * torch.finfo(torch.float32).eps * (hidden.abs() @ w.abs().T).max())


@pytest.mark.parametrize("fault", ["temperature+top_p", "repetition_penalty", "bf16"])
def test_streamed_logits_give_the_held_audit(llama_model, fault, monkeypatch):
    """Hidden states projected 7 rows at a time give the same gap, floor, causes and estimates as the whole
    logits held; a share moves by at most 2 * (2 L delta) / gap, L = 1 / T the processors' Lipschitz constant."""
    planted = plant(llama_model, fault)
    held = aligntools.audit(planted.records, llama_model, old=planted.old)
    monkeypatch.setattr(aligntools.audit.score, "HOLD_ELEMENTS", 0)
    monkeypatch.setattr(aligntools.audit.logits, "CHUNK_ELEMENTS", 7 * llama_model.config.vocab_size)
    streamed = aligntools.audit(planted.records, llama_model, old=planted.old)
    assert (streamed.gap, streamed.floor, streamed.verdict) == (held.gap, held.floor, held.verdict)
    assert [c.name for c in streamed.causes] == [c.name for c in held.causes], streamed.summary()
    t = next((c.estimate for c in held.causes if c.name == "temperature"), 1.0)
    bound = 2 * 2 * _projection_error(llama_model, planted.records) / min(t, 1.0) / held.gap
    for a, b in zip(streamed.causes, held.causes):
        if isinstance(b.estimate, float) and a.name != "numeric":
            assert abs(a.estimate / b.estimate - 1) <= 2 * FIT_RTOL, (a, b)
        else:
            assert a.estimate == pytest.approx(b.estimate, rel=bound), (a, b)
        assert abs(a.share - b.share) <= bound, (a, b, bound)


def _context(seed: int, n: int = 40, vocab: int = 64) -> tuple[Context, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3  # [n, V]
    tokens = torch.randint(0, 12, (n,), generator=g).tolist()  # few distinct ids: many repeats
    engine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0] - 0.1
    ctx = Context.of([Record((3, 4, 5), tuple(tokens), tuple(engine.tolist()))], model=None, vocab=vocab)
    return ctx, logits.float()


@pytest.mark.parametrize("kind", ["repetition_penalty", "presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("tempered", [False, True])
def test_sparse_penalty_loss_is_the_dense_one(kind, tempered):
    """The seen tokens alone plus the unseen log-mass, against the dense processor: both float64, they differ
    by the summation order of a V-term logsumexp (V * eps relative)."""
    ctx, logits = _context(0)
    state = State(logits, ctx.tokens, ctx.owner)
    if tempered:
        state = state.with_processor("temperature", lambda z, rows: z / 0.7)
    loss = _penalty_loss(ctx, state, kind)
    for value in (0.5, 1.0, 1.3, 2.5):
        dense = gap(ctx, state.with_processor("penalty", _penalised(ctx, kind, value)))
        assert loss(value) == pytest.approx(dense, abs=ctx.vocab * torch.finfo(torch.float64).eps * 100)


def test_fp32_temperature_loss_is_the_dense_one():
    """fp32 differences d = z - max: |lp error| <= (2 max|d| / T + V) * eps32 (rounding of d, then of the
    V-term sum)."""
    ctx, logits = _context(1)
    state = State(logits, ctx.tokens, ctx.owner)
    loss = _tempered_loss(ctx, state)
    spread = float((logits - logits.max(-1, keepdim=True).values).abs().max())
    for t in (0.05, 0.7, 1.0, 3.0, 20.0):
        dense = gap(ctx, state.with_processor("temperature", lambda z, rows, t=t: z / t))
        bound = (2 * spread / t + ctx.vocab) * torch.finfo(torch.float32).eps
        assert math.isclose(loss(t), dense, abs_tol=bound), (t, loss(t), dense, bound)
