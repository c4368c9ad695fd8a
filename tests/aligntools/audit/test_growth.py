"""``aligntools.audit.growth``: planted growth on the tiny model's own samples, against a direct float64
computation (the model in float64, the reweighting and Shapley values written out by permutations)."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from aligntools.audit.growth import FACTORS, LOW_PROB, figure, growth
from aligntools.audit.planted import _prompts, generate
from aligntools.records import Record, write_jsonl

STEPS = 3


@pytest.fixture(scope="module")
def pool(llama_model):
    """24 sampled completions (T = 1.5: a share of low-probability tokens) with the float64 model's
    logprob and entropy at every token: (prompts, completions, logprobs [24, 10], entropy [24, 10])."""
    prompts = _prompts(llama_model, 24, 6, seed=3)
    completions, _ = generate(llama_model, prompts, 10, seed=3, temperature=1.5)
    model64 = copy.deepcopy(llama_model).double()
    with torch.no_grad():
        logits = model64(input_ids=torch.cat([prompts, completions], 1)).logits[:, prompts.shape[1] - 1:-1]
    logp = torch.log_softmax(logits, -1)  # [24, 10, V] float64
    lp64 = logp.gather(-1, completions[..., None])[..., 0]
    return prompts.tolist(), completions.tolist(), lp64.numpy(), -(logp.exp() * logp).sum(-1).numpy()


def _records(pool, picks: list[list[int]], bias) -> list[Record]:
    """Step s holds the records ``picks[s]``; engine logprob = float64 logprob - bias(step, p)."""
    prompts, completions, lp64, _ = pool
    return [Record(tuple(prompts[i]), tuple(completions[i]),
                   tuple(min(0.0, float(lp - bias(s, math.exp(lp)))) for lp in lp64[i]), step=s)
            for s, idx in enumerate(picks) for i in idx]


def test_a_growing_bias_on_low_probability_tokens_is_growth_within(pool, llama_model):
    """The same tokens every step, a bias of 0.01 * step on tokens below p = 0.1: the mix never changes,
    so every factor's share is 0 and ``within`` is the whole growth, 0.01 * step * the low-p share."""
    records = _records(pool, [list(range(24))] * STEPS, lambda s, p: 1e-3 + (0.01 * s if p < LOW_PROB[1] else 0.0))
    ds = growth(records, llama_model)
    low = float((np.exp(pool[2]) < LOW_PROB[1]).mean())
    assert 0.1 < low < 0.9
    expected = np.array([1e-3 + 0.01 * s * low for s in range(STEPS)])  # float64 gap per step
    np.testing.assert_allclose(ds["gap"].values, expected, atol=2e-6)
    np.testing.assert_allclose(ds["contribution"].sel(term="within").values, expected - expected[0], atol=2e-6)
    np.testing.assert_allclose(ds["contribution"].sel(term=list(FACTORS)).values, 0.0, atol=1e-12)


def test_a_shifting_mix_is_growth_by_factor_matching_a_direct_shapley(pool, llama_model):
    """A fixed gap per probability bin (0.05 below p = 0.1, 0.002 above) and records chosen so the
    low-probability share rises step by step: ``within`` is ~0, the contributions sum to the growth,
    low_prob's is the largest, and each equals the Shapley value computed here by permutations."""
    share = (np.exp(pool[2]) < LOW_PROB[1]).mean(1)  # per record
    order = list(np.argsort(share, kind="stable"))
    picks = [order[:8], order[8:16], order[16:]]
    bias = lambda s, p: 0.05 if p < LOW_PROB[1] else 0.002  # noqa: E731
    ds = growth(records := _records(pool, picks, bias), llama_model)
    parts = ds["contribution"]
    np.testing.assert_allclose(parts.sum("term").values, ds["growth"].values, atol=1e-12)
    assert abs(float(parts.sel(term="within")[-1])) < 5e-6 and float(ds["growth"][-1]) > 0.005
    assert str(parts.isel(step=-1).idxmax("term").values) == "low_prob"
    np.testing.assert_allclose(parts.sel(term=list(FACTORS)).values, _direct(pool, picks, records), atol=1e-6)
    assert figure(ds).axes


def _direct(pool, picks: list[list[int]], records: list[Record]) -> np.ndarray:
    """[step, factor] Shapley values of the mix, as the mean over the 24 orders of adding the factors
    of each one's marginal v, with every token's gap, probability and entropy in float64."""
    _, _, lp64, ent64 = pool
    rows = [(s, i, t) for s, idx in enumerate(picks) for i in idx for t in range(lp64.shape[1])]
    gap = np.abs(np.array([lp64[i, t] for _, i, t in rows]) - np.array([x for r in records for x in r.logprobs]))
    step, pos = np.array([s for s, _, _ in rows]), np.array([t for _, _, t in rows])
    prob, ent = np.exp([lp64[i, t] for _, i, t in rows]), np.array([ent64[i, t] for _, i, t in rows])
    b = {"length": (pos >= np.median(pos)).astype(int), "low_prob": np.searchsorted(LOW_PROB, prob, side="right"),
         "entropy": (ent >= np.median(ent)).astype(int), "staleness": np.zeros(len(rows), int)}

    def v(subset: frozenset, s: int) -> float:
        key = [tuple(b[f][j] for f in sorted(subset)) for j in range(len(rows))]
        first, now, total = step == 0, step == s, 0.0
        for cell in {k for j, k in enumerate(key) if first[j] or now[j]}:
            inside = np.array([k == cell for k in key])
            at0, ats = first & inside, now & inside
            g0 = gap[at0].mean() if at0.any() else gap[ats].mean()
            total += (ats.sum() / now.sum() - at0.sum() / first.sum()) * g0
        return total

    out = np.zeros((len(picks), len(FACTORS)))
    orders = list(itertools.permutations(FACTORS))
    for s in range(len(picks)):
        for order in orders:
            for k, f in enumerate(order):
                out[s, FACTORS.index(f)] += (v(frozenset(order[:k + 1]), s) - v(frozenset(order[:k]), s)) / len(orders)
    return out


def test_one_file_per_step_takes_the_files_order(pool, llama_model, tmp_path):
    records = _records(pool, [[0, 1], [2, 3]], lambda s, p: 0.01 * (s + 1))
    paths = []
    for s in range(2):
        paths.append(write_jsonl([Record(r.prompt_ids, r.completion_ids, r.logprobs) for r in records if r.step == s],
                                 tmp_path / f"dump_{s}.jsonl"))
    ds = growth(paths, llama_model)
    assert list(ds["step"].values) == [0, 1]
    np.testing.assert_allclose(ds["gap"].values, [0.01, 0.02], atol=2e-6)
