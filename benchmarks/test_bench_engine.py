"""pytest-benchmark for the minirl engine (``make bench``): generate and score on the zoo MoE,
next to transformers on the same inputs. Small sizes; the full comparison (batch 32, 128 new
tokens, printed as a ratio) is benchmarks/bench_engine.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from minirl import Engine, SamplingParams

REPO = Path(__file__).resolve().parent.parent
NEW_TOKENS = 16


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Same setting as bench_engine.py: one intra-op thread is steadier on a shared CPU box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup():
    import transformers

    from labs import zoo

    root = Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))  # the test suite's zoo cache
    path = zoo.build("tiny-qwen3-moe", out=root / "tiny-qwen3-moe-seed0")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = torch.randint(3, 500, (8, 16), generator=torch.Generator().manual_seed(0))
    return Engine.from_pretrained(path), hf, prompts


def test_minirl_generate(benchmark, setup):
    engine, _, prompts = setup
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=0)
    outs = benchmark(engine.generate, prompts.tolist(), params)
    assert all(len(o.token_ids) == NEW_TOKENS for o in outs)


def test_hf_generate(benchmark, setup):
    _, hf, prompts = setup

    def run():
        with torch.no_grad():
            return hf.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                               max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                               pad_token_id=hf.config.pad_token_id)

    assert benchmark(run).shape[1] == prompts.shape[1] + NEW_TOKENS


def test_minirl_score(benchmark, setup):
    engine, _, prompts = setup
    lps = benchmark(engine.score, prompts.tolist())
    assert len(lps) == len(prompts) and all(torch.isfinite(lp).all() for lp in lps)


def test_decode_table_runs_on_cpu():
    """``decode_table`` (what the GPU check times at batch 1/32/256) at CPU sizes: every side
    is timed, and on CPU there is no graph column."""
    from benchmarks.bench_engine import decode_table, print_decode_table

    res = decode_table(device="cpu", batches=(1, 3), prompt_len=8, new_tokens=4, repeats=1)
    sides = ("minirl eager", "hf dynamic", "hf static", "eager / hf static")
    assert sorted(res) == sorted(f"batch {b} {s}" for b in (1, 3) for s in sides)
    assert all(v > 0 for v in res.values())
    print_decode_table(res)


def test_minirl_sample(benchmark):
    """One decode step's sampling at smollm2's vocabulary and the RL batch (bench_engine.py --sampler
    prints it beside torch.multinomial and vLLM's exponential race)."""
    from minirl.engine.sampling import sample

    z = torch.randn(32, 49_152, generator=torch.Generator().manual_seed(0))
    tokens, _, _ = benchmark(sample, z, SamplingParams(), 0, torch.arange(32), 0)
    assert tokens.shape == (32,) and int(tokens.max()) < 49_152
