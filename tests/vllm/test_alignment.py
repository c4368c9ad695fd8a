"""vLLM float32 against transformers float32: the alignment gate passes at every site.

The gate's rule: each site's error must stay within the tolerance widened by the trainer's
own float32-vs-float64 error (the noise floor), as ``mlab check`` does.
"""

from __future__ import annotations

import numpy as np
import pytest

import aligntools
from minirl.engines import load_hf
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm
ARCHS = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral"]


def gate(path, vllm_cap, ids):
    train = aligntools.capture(load_hf(path, "float32"), ids, progress=False)
    ref = aligntools.capture(load_hf(path, "float64"), ids, progress=False)
    floors = {s: r.summary["rel_l2"] for s, r in aligntools.compare(ref, train).results.items()
              if "rel_l2" in r.summary}
    return train, aligntools.compare(train, vllm_cap, tolerance=aligntools.Tolerance().with_noise_floor(floors))


@pytest.mark.parametrize("name", ARCHS)
def test_vllm_fp32_passes_the_gate_at_every_site(name, zoo, vllm_llm, prompt_ids):
    cap = aligntools.capture(vllm_llm(name), prompt_ids, progress=False)
    train, cmp = gate(zoo(name), cap, prompt_ids)
    assert set(cap.sites) == set(train.sites)  # every site, routing included for MoE
    assert cmp.passes, cmp.table.loc[cmp.failures, ["rel_l2", "limit"]]
    for site in ("logits", "entropy"):  # every prompt position, not only the last
        assert not np.isnan(cap.dataset[site].values).any(), site
    lp = cap.dataset["logprobs"].values.reshape(prompt_ids.shape)
    assert not np.isnan(lp[:, :-1]).any() and np.isnan(lp[:, -1]).all()


@pytest.mark.slow
def test_smollm2_fp32_passes_the_gate(zoo, vllm_llm):
    pytest.importorskip("gguf")
    ids = aligntools.gates.inputs.prepare_tokens(zoo("smollm2-135m"), 96)
    cap = aligntools.capture(vllm_llm("smollm2-135m"), ids, progress=False)
    _, cmp = gate(zoo("smollm2-135m"), cap, ids)
    assert cmp.passes, cmp.table.loc[cmp.failures, ["rel_l2", "limit"]]
