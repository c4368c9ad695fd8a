"""Continuous batching: requests of different lengths decode together, finish at different
steps, and every captured row equals the row of a prefill over the same final sequence."""

from __future__ import annotations

import numpy as np

import aligntools
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm
NAME = "tiny-qwen3-moe"
SITES = "L*.q,L*.resid_post,L*.router_logits,L*.topk_ids,final_norm,logits,logprobs"


def rows(cap) -> dict[tuple[int, int], int]:
    ds = cap.dataset
    return {(int(r), int(p)): i for i, (r, p) in enumerate(zip(ds["request"].values, ds["position"].values))}


def test_decode_rows_line_up_with_a_prefill_of_the_final_sequences(vllm_llm):
    from vllm import SamplingParams

    llm = vllm_llm(NAME)
    prompts = [list(range(10, 15)), list(range(40, 49)), list(range(90, 103))]  # 5, 9, 13 tokens
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (3, 7, 5)]
    with aligntools.Tracker(llm, sites=SITES, progress=False) as t:
        out = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    decode = t.capture
    steps = decode.dataset["step"].values
    assert steps.max() == 6 and (steps == 0).sum() == 27  # prefill rows + 6 decode steps of the longest
    final = [p + list(o.outputs[0].token_ids[:-1]) for p, o in zip(prompts, out)]  # the last token is not fed back
    with aligntools.Tracker(llm, sites=SITES, progress=False) as t:
        llm.generate([{"prompt_token_ids": f} for f in final], SamplingParams(max_tokens=1, prompt_logprobs=0),
                     use_tqdm=False)
    prefill = t.capture
    a, b = rows(decode), rows(prefill)
    assert set(a) == set(b) and len(a) == sum(map(len, final))
    order = [a[k] for k in sorted(a)], [b[k] for k in sorted(b)]
    for site in decode.sites:
        x, y = decode.dataset[site].values[order[0]], prefill.dataset[site].values[order[1]]
        if site in ("logits", "logprobs"):  # decode computes logits only where it samples
            keep = ~np.isnan(x).reshape(len(x), -1).any(-1)
            x, y = x[keep], y[keep]
            assert keep.sum() == sum(len(o.outputs[0].token_ids) for o in out) - (site == "logprobs") * len(out)
        if site.endswith("topk_ids"):
            np.testing.assert_array_equal(np.sort(x, -1), np.sort(y, -1), err_msg=site)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4, err_msg=site)
    greedy = decode.dataset["logits"].values.argmax(-1)  # the sampled tokens are the captured argmax
    tok = {(int(r), int(p)): int(v) for r, p, v in zip(decode.dataset["request"].values,
                                                       decode.dataset["position"].values, greedy)}
    for r, (p, o) in enumerate(zip(prompts, out)):
        assert [tok[(r, len(p) - 1 + j)] for j in range(len(o.outputs[0].token_ids))] == list(o.outputs[0].token_ids)
