"""Routed expert ids recorded by generate(): what R3 router replay consumes."""

from __future__ import annotations

import pytest
import torch

from minirl import Knobs, SamplingParams


def _topk_sorted(logits: torch.Tensor, k: int) -> torch.Tensor:
    return logits.float().softmax(-1).topk(k, dim=-1).indices.sort(-1).values


def _is_a_topk(ids: torch.Tensor, logits: torch.Tensor) -> bool:
    """``ids`` are k distinct experts none of which scores below an unchosen one (bf16 logits
    tie often; any tie-break is a valid top-k, which one is the ``topk`` knob's business)."""
    chosen = torch.zeros_like(logits, dtype=torch.bool)
    chosen[ids] = True
    return int(chosen.sum()) == ids.numel() and bool(logits[chosen].min() >= logits[~chosen].max())


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_recorded_routing_is_the_topk_of_the_engines_router_logits(name, engine, prompts):
    eng = engine(name, "bfloat16")  # typical knobs: unstable top-k, bf16 router
    k, seen = eng.spec.top_k, {}

    def tap(site, value, meta):
        if site.endswith("router_logits"):
            layer = eng.moe_layers.index(int(site[1:].split(".")[0]))
            for j in range(value.shape[0]):
                seen[int(meta.request[j]), int(meta.position[j]), layer] = value[j].clone()

    eng.add_tap(tap)
    outs = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=2, ignore_eos=True))
    for r, o in enumerate(outs):
        p, t = len(o.prompt_ids), len(o.token_ids)
        assert o.prompt_routed_experts.shape == (p, len(eng.moe_layers), k)
        assert o.routed_experts.shape == (t, len(eng.moe_layers), k)
        assert o.routed_experts.dtype == torch.int64
        routing = torch.cat([o.prompt_routed_experts, o.routed_experts])  # positions 0 .. p+t-1
        for pos in range(p + t):
            for layer in range(len(eng.moe_layers)):
                assert _is_a_topk(routing[pos, layer], seen[r, pos, layer].float()), (r, pos, layer)


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_routing_convention_lines_up_with_the_trainers_forward(name, engine, hf_model, prompts):
    """``cat(prompt_routed_experts, routed_experts)`` is the routing of ``prompt + tokens``
    position by position (each position routed when fed as input: the verl/slime R3 convention)."""
    eng, hf = engine(name, knobs=Knobs.aligned()), hf_model(name)
    for o in eng.generate(prompts, SamplingParams(max_new_tokens=6, seed=4, ignore_eos=True)):
        ids = torch.tensor([o.prompt_ids + o.token_ids])
        with torch.no_grad():
            router_logits = hf(ids, output_router_logits=True).router_logits  # per layer [S, E]
        routing = torch.cat([o.prompt_routed_experts, o.routed_experts])
        for j, layer in enumerate(eng.moe_layers):
            expected = _topk_sorted(router_logits[layer], eng.spec.top_k)
            assert torch.equal(routing[:, j].sort(-1).values, expected), (name, layer)


def test_dense_models_have_no_routing(engine, prompts):
    eng = engine("tiny-llama")
    assert eng.moe_layers == []
    o = eng.generate(prompts[:1], SamplingParams(max_new_tokens=2, seed=0))[0]
    assert o.routed_experts is None and o.prompt_routed_experts is None


@pytest.mark.parametrize("skewed", [False, True])
def test_both_expert_groupings_compute_every_pair_with_its_expert(skewed):
    """Decode-size batches use one padded batched GEMM, prefill-size ones per-expert segments;
    both must give each (token, slot) pair its own expert's output."""
    from minirl.engine.moe import _Padded, _Sorted, _padding_is_cheap

    g = torch.Generator().manual_seed(0)
    n, k, n_exp = 40, 2, 6
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:k] for _ in range(n)])  # [N, k] distinct
    if skewed:
        ids[:, 0] = 1  # every token picks expert 1: padding would be wasteful
    flat = ids.reshape(-1)
    seen = torch.nn.functional.one_hot(flat, n_exp).cumsum(0)
    assert _padding_is_cheap(seen) is not skewed
    x = torch.randn(n * k, 16, generator=g, dtype=torch.float64)
    w = torch.randn(n_exp, 8, 16, generator=g, dtype=torch.float64)
    expected = torch.stack([w[e] @ row for e, row in zip(flat.tolist(), x)])  # [P, 8]
    for groups in (_Padded(flat, seen), _Sorted(flat, seen[-1])):
        torch.testing.assert_close(groups.ungroup(groups.linear(groups.group(x), w)), expected)
