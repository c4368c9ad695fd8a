"""transformers itself, captured as the engine, is fingerprinted as ``hf_exact`` at distance 0.

Why: the fingerprint names the minirl knob setting that reproduces an engine; an engine that *is*
transformers (TRL's own generate, a trainer's eval) must come out as transformers' own setting with no
gap left, or every smaller gap the fingerprint reports is in doubt. tiny-mixtral needs the two MoE knobs
a dense model never exercises: the tie order of the top-k (its bf16 router scores tie at the k-th expert
for some tokens) and the experts' sum (fp32 routing weights, transformers' ``grouped_mm`` path).
"""

from __future__ import annotations

import aligntools
from aligntools.gates.inputs import prepare_tokens
from minirl.engines import load_hf


def test_transformers_bf16_mixtral_is_fingerprinted_as_itself(zoo):
    path = zoo("tiny-mixtral")
    ids = prepare_tokens(path, 64)  # [4, 16] of the built-in text
    found = aligntools.fingerprint(aligntools.capture(load_hf(path, "bfloat16"), ids), path)
    assert found.distance == 0 and found.gap_start is None, found
    assert (found.knobs.topk, found.knobs.expert_sum_order) == ("torch", "grouped_mm"), found.knobs
    assert found.knobs.attention == "sdpa"  # what from_pretrained picks when a trainer does not say
    assert list(found.explained.index) == ["attention"]  # the one knob where it differs from hf_exact (eager)


def test_transformers_bf16_ring_linear_is_fingerprinted_with_its_chunked_prefill(zoo):
    """BailingHybrid's KDA prefill in transformers runs in chunks of 64; token by token (the engine's
    default) some bf16 outputs round the other way: on this 70-token row, 0.016 in a log-prob (about half
    the seeds tried; on seed 0 the two forms round alike)."""
    import torch

    path = zoo("tiny-ring-linear")
    ids = torch.randint(3, 512, (1, 70), generator=torch.Generator().manual_seed(1))  # [1, 70]
    found = aligntools.fingerprint(aligntools.capture(load_hf(path, "bfloat16"), ids, progress=False), path,
                                   progress=False)
    assert found.distance == 0 and found.gap_start is None, found
    assert found.knobs.linear_attention == "chunked", found.knobs
