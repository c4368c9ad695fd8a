"""The CUDA-graph decode path on CPU: buckets, the static step a graph captures, and the
graph-mode bookkeeping of ``generate`` (persistent cache, padding rows, compaction), with
the capture itself replaced by running the static step eagerly. The replay on a card is
tests/minirl/engine/test_engine_cuda.py."""

from __future__ import annotations

import pytest
import torch

import kernels
from minirl import Knobs, SamplingParams
from minirl.engine import runner
from minirl.engine.batch import ForwardBatch
from minirl.engine.graphs import BUCKETS, DecodeGraphs, bucket, cache_rows
from minirl.engine.moe import MoEConfig, experts_forward


class EagerGraphs(DecodeGraphs):
    """``DecodeGraphs`` whose 'graphs' are the static step run eagerly (what a replay computes)."""

    def capture(self, buckets: list[int]) -> None:
        self.graphs.update({b: None for b in buckets})
        self.cache.reset()

    def run(self, tokens: torch.Tensor, positions: torch.Tensor):
        return self.static.run(tokens, positions)


@pytest.fixture
def graph_mode(monkeypatch):
    """Engines built after this decode through the graph-mode path on CPU."""
    monkeypatch.setattr(runner, "DecodeGraphs", EagerGraphs)
    monkeypatch.setattr(runner.ModelRunner, "eager_reason", lambda self: None)


def test_buckets():
    assert BUCKETS == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert [bucket(n) for n in (1, 2, 3, 5, 32, 33, 255, 256)] == [1, 2, 4, 8, 32, 64, 256, 256]
    assert bucket(257) is None  # eager above the largest bucket
    assert [cache_rows(n) for n in (1, 3, 200, 300)] == [1, 4, 256, 300]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (int(torch.randint(3, 12, (), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _stop_len(tokens: list[int], stop: int) -> int:
    return tokens.index(stop) + 1 if stop in tokens else len(tokens)


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-llama"])
def test_static_decode_matches_the_dynamic_decode(name, engine, graph_mode):
    """Sampled rollouts (same noise on both paths) of unequal prompts, rows stopping at different steps (stop ids), 5 rows
    padded to bucket 8 and shrinking through buckets 4, 2, 1: the same tokens and routing as the
    eager dynamic step, logprobs within fp32 reduction-order noise."""
    eager = engine(name)
    free = eager.generate(_prompts(5), SamplingParams(max_new_tokens=12, seed=3, ignore_eos=True))
    candidates = {t for o in free for t in o.token_ids}
    stop = max(candidates, key=lambda t: len({_stop_len(o.token_ids, t) for o in free}))
    params = SamplingParams(max_new_tokens=12, seed=3, stop_token_ids=[stop], ignore_eos=True)
    want = eager.generate(_prompts(5), params)
    assert len({len(o.token_ids) for o in want}) >= 3  # rows end at different steps: compaction runs

    static = engine(name)
    assert static.decode_path.startswith("cuda graphs")
    for _ in range(2):  # the second call reuses the persistent cache, reset
        got = static.generate(_prompts(5), params)
        assert static.runner.graphs.cache.rows == 8 and sorted(static.runner.graphs.graphs) == [1, 2, 4, 8]
        for g, w in zip(got, want):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            assert torch.allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)
            if w.routed_experts is not None:
                assert torch.equal(g.routed_experts, w.routed_experts)
    first_cache = static.runner.graphs.cache
    static.generate(_prompts(3), params)  # fewer rows, shorter: fits, same cache (the graphs' addresses)
    assert static.runner.graphs.cache is first_cache


def test_sampled_static_decode_matches_with_shared_prefill(engine, graph_mode):
    """Sampling (T=1, n=3, prompts prefilled once) goes through the same graph-mode loop."""
    knobs = Knobs.typical_inference().replace(share_prefill=True)
    params = SamplingParams(n=3, max_new_tokens=6, seed=1, ignore_eos=True)
    want = engine("tiny-qwen3-moe", knobs=knobs)
    with pytest.MonkeyPatch.context() as m:  # the reference decodes eagerly
        m.setattr(runner.ModelRunner, "eager_reason", lambda self: "reference")
        ref = want.generate(_prompts(3, seed=4), params)
    got = engine("tiny-qwen3-moe", knobs=knobs).generate(_prompts(3, seed=4), params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert max((g.logprobs - r.logprobs).abs().max().item() for g, r in zip(got, ref)) < 1e-5


@pytest.mark.parametrize("cache_dtype", [None, torch.float32])
def test_static_rope_is_the_cached_table_kernel(engine, cache_dtype):
    """The static step reads the model's RoPE table itself (the kernel asks ``positions.max()``
    on the host, which a graph cannot); it must stay the kernel's numbers bit for bit."""
    knobs = Knobs.typical_inference() if cache_dtype is None else Knobs.typical_inference().replace(
        rope_cache_dtype="float32")
    model = engine("tiny-qwen3", "bfloat16", knobs).model
    x = torch.randn(5, 6, model.spec.head_dim, dtype=torch.bfloat16)
    positions = torch.tensor([0, 3, 17, 100, 4])
    batch = ForwardBatch.static_decode(torch.zeros(5, dtype=torch.long), positions, torch.arange(5), 128, step=1)
    want = kernels.get("rope", "cached_table")(x, positions, theta=model.spec.rope_theta, **model.rope_kw)
    assert torch.equal(model.apply_rope(x, batch), want)
    assert model.rope_tables[model.spec.rope_theta].shape[0] >= model.spec.max_positions


def test_static_moe_pads_for_the_worst_routing():
    """The static expert dispatch has room for every token in one expert, reads no count back,
    and computes the dynamic dispatch's numbers."""
    g = torch.Generator().manual_seed(0)
    n, h, inter, e, k = 6, 16, 8, 4, 2
    x = torch.randn(n, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)])  # [N, k] distinct per token
    ids[:, 0] = 2  # every token picks expert 2: the worst case the padding must hold
    weights = torch.rand(n, k, generator=g)
    gate_up, down = torch.randn(e, 2 * inter, h, generator=g), torch.randn(e, h, inter, generator=g)
    cfg = MoEConfig(top_k=k, renormalize=True, weights_in_logits_dtype=False, router_dtype=torch.float32,
                    topk_fn=kernels.get("router_topk", "stable"), sum_order="topk_slot",
                    activation="fused_silu_mul", tp=1)
    static = experts_forward(x, ids, weights, gate_up, down, cfg, static=True)
    dynamic = experts_forward(x, ids, weights, gate_up, down, cfg)
    assert torch.allclose(static, dynamic, atol=1e-5, rtol=1e-5)


def test_graphs_module_keeps_capture_off_the_cpu_path(engine):
    """On CPU nothing is captured: the engine says why and allocates a per-call cache."""
    eng = engine("tiny-llama")
    assert eng.decode_path == "eager: device cpu: CUDA graphs need a CUDA device"
    eng.generate(_prompts(2), SamplingParams(max_new_tokens=3, ignore_eos=True, seed=0))
    assert eng.runner.graphs is None
