"""generate(): seeding, stopping, batching, and the sampler's distribution."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from minirl import Knobs, SamplingParams
from minirl.engine.sampling import BLOCK, inverse_cdf, sample, uniforms

GREEDY = dict(temperature=0.0, ignore_eos=True)


def test_seeded_generate_is_reproducible_and_seed_sensitive(engine, prompts):
    eng = engine("tiny-qwen3")
    params = SamplingParams(n=2, max_new_tokens=8, seed=5, ignore_eos=True)
    a, b = eng.generate(prompts, params), eng.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(torch.equal(x.logprobs, y.logprobs) for x, y in zip(a, b))
    c = eng.generate(prompts, dataclasses.replace(params, seed=6))
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    assert a[0].token_ids != a[1].token_ids  # the n samples of one prompt are distinct draws

    torch.manual_seed(0)
    d = eng.generate(prompts, SamplingParams(max_new_tokens=4))
    torch.manual_seed(0)
    e = eng.generate(prompts, SamplingParams(max_new_tokens=4))
    assert [o.token_ids for o in d] == [o.token_ids for o in e]  # seed=None follows torch's RNG


def test_batch_of_one_vs_eight(engine):
    """Documented relationship: bit-identical with ``batch_invariant=True`` (each request is
    computed alone); otherwise batched GEMMs may round differently, and the difference is
    reported here, not asserted."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (4, 7, 5, 9, 3, 6, 8, 5)]
    params = SamplingParams(max_new_tokens=6, **GREEDY)
    inv = engine("tiny-qwen3-moe", "bfloat16", Knobs.typical_inference().replace(batch_invariant=True))
    batched = inv.generate(prompts, params)
    for p, o in zip(prompts, batched):
        alone = inv.generate([p], params)[0]
        assert alone.token_ids == o.token_ids and torch.equal(alone.logprobs, o.logprobs)
        assert torch.equal(alone.routed_experts, o.routed_experts)

    typ = engine("tiny-qwen3-moe", "bfloat16", Knobs.typical_inference())
    seqs = [o.prompt_ids + o.token_ids for o in batched]
    together = typ.score(seqs)
    diff = max((a - typ.score([s])[0]).abs().max().item() for a, s in zip(together, seqs))
    print(f"\nbatch_invariant=False, bf16: max |logprob(batch of 8) - logprob(alone)| = {diff:.3g}")
    assert math.isfinite(diff)  # reported, not asserted to a number


def test_stop_ids_finish_sequences_independently(engine, prompts):
    eng = engine("tiny-llama", knobs=Knobs.aligned())
    free = eng.generate(prompts, SamplingParams(max_new_tokens=8, **GREEDY))
    first = free[0].token_ids
    j = next(i for i, t in enumerate(first) if t not in first[:i] and i >= 1)  # a fresh token
    stopped = eng.generate(prompts, SamplingParams(max_new_tokens=8, stop_token_ids=[first[j]], **GREEDY))
    assert stopped[0].token_ids == first[: j + 1] and stopped[0].finish_reason == "stop"
    assert stopped[0].logprobs.shape == (j + 1,)
    for s, f in zip(stopped[1:], free[1:]):  # the others run on, unaffected by the early finish
        if first[j] not in f.token_ids:
            assert s.token_ids == f.token_ids and s.finish_reason == "length"
            torch.testing.assert_close(s.logprobs, f.logprobs, rtol=0, atol=1e-6)


def test_eos_from_config_stops_unless_ignored(engine, prompts):
    eng = engine("tiny-llama")
    tok = eng.generate(prompts[:1], SamplingParams(max_new_tokens=3, **GREEDY))[0].token_ids[0]
    eng.spec = dataclasses.replace(eng.spec, eos_token_ids=(tok,))
    assert eng.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0))[0].token_ids == [tok]
    assert len(eng.generate(prompts[:1], SamplingParams(max_new_tokens=3, **GREEDY))[0].token_ids) == 3


def test_generation_stops_at_max_positions(engine):
    eng = engine("tiny-qwen3")
    limit = eng.spec.max_positions
    out = eng.generate([[5] * (limit - 2)], SamplingParams(max_new_tokens=10, **GREEDY))[0]
    assert len(out.token_ids) == 2 and out.finish_reason == "length"


def test_top_k_1_is_greedy_and_processed_logprobs(engine, prompts):
    eng = engine("tiny-qwen3")
    greedy = eng.generate(prompts, SamplingParams(max_new_tokens=5, **GREEDY))
    topk1 = eng.generate(prompts, SamplingParams(max_new_tokens=5, top_k=1, seed=1, ignore_eos=True,
                                                 return_processed_logprobs=True))
    for g, t in zip(greedy, topk1):
        assert g.token_ids == t.token_ids
        assert torch.all(t.processed_logprobs == 0)  # a one-token distribution
        assert torch.all(t.logprobs < 0)  # raw logprobs are pre top-k
    plain = eng.generate(prompts, SamplingParams(max_new_tokens=5, seed=1, return_processed_logprobs=True))
    assert all(torch.equal(o.processed_logprobs, o.logprobs) for o in plain)  # T=1, no filters
    assert greedy[0].processed_logprobs is None


def test_sampler_matches_the_processed_distribution():
    """Inverse-CDF sampling of hashed uniforms: empirical frequencies equal softmax of the processed logits."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].expand(20000, -1)  # 20000 independent rows
    rows = torch.arange(20000)
    cases = [(SamplingParams(), probs),
             (SamplingParams(top_p=0.7), torch.tensor([0.5, 0.3, 0, 0]) / 0.8),
             (SamplingParams(top_k=3, temperature=2.0), probs[:3].sqrt() / probs[:3].sqrt().sum())]
    for params, expected in cases:
        expected = torch.nn.functional.pad(expected, (0, 4 - expected.numel()))
        tokens, raw, _ = sample(logits, dataclasses.replace(params, return_processed_logprobs=True), 9, rows, 0)
        freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
        assert (freq - expected).abs().max() < 0.015, (params, freq, expected)
        torch.testing.assert_close(raw, probs.log()[tokens])
    tok, _, processed = sample(logits[:1], SamplingParams(top_p=0.7, return_processed_logprobs=True), 9,
                               rows[:1], 0)
    torch.testing.assert_close(processed, (torch.tensor([0.5, 0.3]) / 0.8).log()[tok])


def test_each_token_is_the_float64_inverse_cdf_of_its_rows_uniform():
    """The token is the first whose cumulative probability (float64) reaches the row's uniform,
    transcribed independently with numpy's cumsum and searchsorted; a uniform depends on (seed,
    row, step) alone, so a row draws the same token in any batch; a filtered token is never drawn."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4096, 300, generator=g) * 3  # [B, V]: peaked rows and flat ones
    rows = torch.arange(100, 100 + 4096)
    tokens, _, _ = sample(logits, SamplingParams(), 7, rows, 3)
    u = uniforms(7, rows, 3).numpy()
    cdf = np.cumsum(logits.log_softmax(-1).exp().double().numpy(), axis=1)  # the fp32 probabilities drawn from
    reference = [int(np.searchsorted(c, x * c[-1], side="left")) for c, x in zip(cdf, u)]
    assert tokens.tolist() == reference
    assert torch.equal(sample(logits[5::7], SamplingParams(), 7, rows[5::7], 3)[0], tokens[5::7])
    assert not torch.equal(sample(logits, SamplingParams(), 7, rows, 4)[0], tokens)  # another step, other draws
    top2 = logits.topk(2, dim=-1).indices  # [B, 2]
    drawn = sample(logits, SamplingParams(top_k=2), 7, rows, 3)[0]
    assert (drawn[:, None] == top2).any(-1).all()


@pytest.mark.parametrize("vocab", [1, 300, BLOCK, BLOCK + 1, 2500, 5 * BLOCK])
def test_the_two_level_search_is_the_flat_inverse_cdf(vocab):
    """Block sums, then a cumulative sum inside the drawn block: the token of numpy's flat float64
    cumsum + searchsorted, whatever V is against ``BLOCK`` (a short last block, one token), with
    whole blocks of weight 0 (top-k's -inf) in the way; no weight-0 token is ever drawn, even for
    the extreme uniforms."""
    g = torch.Generator().manual_seed(vocab)
    weights = (torch.randn(512, vocab, generator=g) * 3).exp()  # [B, V] peaked and flat rows
    dead = torch.rand(512, -(-vocab // BLOCK), generator=g) < 0.5  # [B, blocks]
    weights[dead.repeat_interleave(BLOCK, 1)[:, :vocab]] = 0.0
    weights[weights.sum(-1) == 0, -1] = 1.0  # every row has some weight
    weights[::5, ::3] = 0.0  # scattered zeros inside the live blocks too
    weights[(weights.sum(-1) == 0).nonzero()[:, 0], 0] = 1.0
    u = torch.rand(512, generator=g, dtype=torch.float64).clamp_(2.0 ** -54, 1 - 2.0 ** -53)
    u[:3] = torch.tensor([2.0 ** -54, 0.5, 1 - 2.0 ** -53], dtype=torch.float64)
    tokens = inverse_cdf(weights, u)
    cdf = np.cumsum(weights.double().numpy(), axis=1)
    assert tokens.tolist() == [int(np.searchsorted(c, x * c[-1], side="left")) for c, x in zip(cdf, u.numpy())]
    assert (weights.gather(1, tokens[:, None]) > 0).all()


def test_the_two_level_search_survives_a_block_sum_above_its_cumulative_sum():
    """A block's float64 sum is not its sequential cumulative sum: with 1.0 at both ends of a short
    last block and 2^-54 between, the sum keeps the small terms (2 + 5.6e-14) where the cumulative
    sum rounds them away (2). A uniform whose target lands past the latter still returns the last
    positive token of the vocabulary, not an index past its end."""
    w = torch.zeros(1, 2 * BLOCK - 1)  # [1, V]: block 0 empty, a last block of BLOCK - 1 entries
    w[0, BLOCK:] = 2.0 ** -54
    w[0, BLOCK] = w[0, -1] = 1.0
    assert w[0, BLOCK:].sum(dtype=torch.float64) > w[0, BLOCK:].double().cumsum(0)[-1]  # the premise
    assert inverse_cdf(w, torch.tensor([1 - 2.0 ** -53], dtype=torch.float64)).tolist() == [w.shape[1] - 1]


def test_uniforms_are_uniform_and_never_0_or_1():
    u = uniforms(0, torch.arange(200_000), 0)
    assert u.dtype == torch.float64 and 0 < u.min() and u.max() < 1
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    assert (counts / 10_000 - 1).abs().max() < 0.04  # 10,000 expected per bin, sd 1 %
    assert uniforms(0, torch.arange(5), 1).unique().numel() == 5
