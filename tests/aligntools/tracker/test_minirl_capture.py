"""minirl engine captures (through its taps) against the hf capture and against itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools


@pytest.fixture(scope="module")
def engine(zoo):
    from minirl import Engine, Knobs

    return lambda name: Engine.from_pretrained(zoo(name), knobs=Knobs.aligned())


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe"])
def test_aligned_engine_equals_hf_site_by_site(engine, hf_model, ids, name):
    eng = engine(name)
    cap, ref = aligntools.capture(eng, ids), aligntools.capture(hf_model(name), ids)
    assert cap.engine == "minirl" and ref.engine == "hf"
    assert cap.sites == ref.sites
    for c in ("token_id", "position", "request", "step"):
        np.testing.assert_array_equal(cap.dataset[c].values, ref.dataset[c].values)
    for s in ref.sites:
        a, b = cap.dataset[s].values, ref.dataset[s].values
        if s.endswith("topk_ids"):
            np.testing.assert_array_equal(a, b, err_msg=s)
        else:
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=s)
    assert cap.knobs["rmsnorm"] == "hf"  # the engine's knobs are stamped on the capture


def test_decode_steps_equal_prefill_positions(engine):
    from minirl import SamplingParams

    eng = engine("tiny-qwen3-moe")
    prompts = [[5, 17, 42, 9], [7, 8]]
    with aligntools.Tracker(eng, sites="L*.resid_post,L*.topk_ids,L1.q,logits,logprobs") as t:
        outs = eng.generate(prompts, SamplingParams(max_new_tokens=3, seed=0))
    dec = t.capture.dataset
    assert sorted(set(dec["step"].values.tolist())) == [0, 1, 2, 3]
    full = aligntools.capture(eng, torch.tensor([p + o.token_ids for p, o in zip(prompts[:1], outs[:1])]),
                              sites="L*.resid_post,L*.topk_ids,L1.q,logits,logprobs").dataset
    rows = (dec["request"] == 0).values
    order = np.argsort(dec["position"].values[rows])
    for s in ("L0.resid_post", "L3.resid_post", "L1.q", "L2.topk_ids", "logits"):
        np.testing.assert_allclose(dec[s].values[rows][order], full[s].values, rtol=0, atol=1e-5, err_msg=s)
    # derived logprobs at every decode row equal the engine's own sampled-token logprobs
    for r, out in enumerate(outs):
        mine = dec["logprobs"].values[(dec["request"] == r).values & (dec["step"].values < len(out.token_ids))]
        mine = mine[len(prompts[r]) - 1:]
        np.testing.assert_allclose(mine, out.logprobs.numpy(), rtol=0, atol=1e-5)


def test_two_calls_get_distinct_requests(engine, ids):
    eng = engine("tiny-llama")
    with aligntools.Tracker(eng, sites="logits") as t:
        eng.score(ids.tolist())
        eng.score(ids[:1].tolist())
    assert sorted(set(t.capture.dataset["request"].values.tolist())) == [0, 1, 2]
    assert "score" not in vars(eng)  # the call wrapper is gone after the block
