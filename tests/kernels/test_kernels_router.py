"""Router top-k: HF semantics, float64 truth, tie-breaking, precision, replay gate."""

from __future__ import annotations

import math

import pytest
import torch
from tests.kernels.kernels_testutil import impl_cases
from tests.kernels.kernels_testutil import variant as variant_fn

import kernels

ALL_VARIANTS = impl_cases("router_topk", ["stable", "unstable"])  # "stable/triton" too


def truth(logits, k, scoring="softmax", renormalize=True):
    """float64 routing with explicit (-score, expert id) ordering, in plain Python."""
    ids, weights = [], []
    for row in logits.double().tolist():
        if scoring == "softmax":
            m = max(row)
            e = [math.exp(v - m) for v in row]
            s = [v / sum(e) for v in e]
        else:
            s = [1 / (1 + math.exp(-v)) for v in row]
        top = sorted(range(len(row)), key=lambda i: (-s[i], i))[:k]
        w = [s[i] for i in top]
        ids.append(top)
        weights.append([v / sum(w) for v in w] if renormalize else w)
    return torch.tensor(ids), torch.tensor(weights, dtype=torch.float64)


def random_logits(n=16, e=8, seed=0, dtype=torch.float32):
    return torch.randn(n, e, generator=torch.Generator().manual_seed(seed)).to(dtype)


def tied_logits(n=16, e=8, seed=0):
    """Integer-valued logits: many exact ties inside every row."""
    return torch.randint(0, 3, (n, e), generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_stable_matches_transformers_qwen3_moe_router(norm_topk_prob):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    e, k = 8, 2
    config = Qwen3MoeConfig(hidden_size=e, num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm_topk_prob)
    router = Qwen3MoeTopKRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(e))  # router logits == the hidden states we pass
        logits = random_logits()
        hf_logits, hf_weights, hf_ids = router(logits)
    assert torch.equal(hf_logits, logits)
    ids, weights = kernels.get("router_topk", "stable")(logits, k, renormalize=norm_topk_prob)
    assert torch.equal(ids, hf_ids) and torch.equal(weights, hf_weights)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_matches_float64_truth_without_ties(variant, scoring, renormalize):
    logits = random_logits(n=6)
    ids, weights = variant_fn("router_topk", variant)(logits, 3, scoring=scoring, renormalize=renormalize)
    t_ids, t_w = truth(logits, 3, scoring, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, t_ids)
    assert torch.allclose(weights.double(), t_w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("variant", ["stable", "stable/triton"])
def test_stable_ties_go_to_lowest_id_and_survive_batch_permutation(variant):
    f = variant_fn("router_topk", variant)
    logits = tied_logits(n=12)
    ids, weights = f(logits, 3)
    assert torch.equal(ids, truth(logits, 3)[0])  # truth orders ties by id
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    p_ids, p_weights = f(logits[perm], 3)
    assert torch.equal(p_ids, ids[perm]) and torch.equal(p_weights, weights[perm])


def test_unstable_tie_winner_depends_on_batch_position():
    """The same token routes differently depending on which batch row it occupies."""
    row = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, 0.0, 1.0, 2.0]])
    batch = row.expand(8, 8).contiguous()  # the same token in 8 batch slots
    stable_ids, _ = kernels.get("router_topk", "stable")(batch, 2)
    unstable_ids, unstable_w = kernels.get("router_topk", "unstable")(batch, 2)
    assert len({tuple(r) for r in stable_ids.tolist()}) == 1
    assert len({tuple(r) for r in unstable_ids.tolist()}) > 1
    assert torch.equal(unstable_w, unstable_w[:1].expand(8, 2))  # tied scores: same weights
    # deterministic: the same layout reproduces the same choice
    assert torch.equal(kernels.get("router_topk", "unstable")(batch, 2)[0], unstable_ids)
    # decode (token alone in row 0) vs prefill (token in row 3) disagree
    alone = kernels.get("router_topk", "unstable")(row, 2)[0][0]
    assert not torch.equal(alone, unstable_ids[3])


def test_unstable_equals_stable_without_ties():
    logits = random_logits(n=32)
    for scoring in ("softmax", "sigmoid"):
        a = kernels.get("router_topk", "stable")(logits, 2, scoring=scoring)
        b = kernels.get("router_topk", "unstable")(logits, 2, scoring=scoring)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bf16_router_precision_changes_expert_choice():
    """Expected direction: near-uniform router scores tie in bf16 and flip experts; fp32 does not."""
    logits = random_logits(n=64, e=16) * 3e-3
    t_ids, _ = truth(logits, 2)
    fp32_ids, _ = kernels.get("router_topk", "stable")(logits, 2)
    bf16_ids, bf16_w = kernels.get("router_topk", "stable")(logits, 2, compute_dtype=torch.bfloat16)
    assert bf16_w.dtype == torch.bfloat16
    assert torch.equal(fp32_ids, t_ids)
    assert (bf16_ids != t_ids).any(dim=1).sum() >= 5


@pytest.mark.parametrize("compute_dtype", [None, torch.bfloat16])
def test_triton_matches_stable(compute_dtype):
    logits = torch.cat([random_logits(n=5, e=12), tied_logits(n=3, e=12)])
    for scoring in ("softmax", "sigmoid"):
        a = kernels.get("router_topk", "stable", impl="triton")(logits, 3, scoring=scoring, compute_dtype=compute_dtype)
        b = kernels.get("router_topk", "stable", impl="torch")(logits, 3, scoring=scoring, compute_dtype=compute_dtype)
        assert torch.equal(a[0], b[0]) and a[1].dtype == b[1].dtype
        if compute_dtype is None:
            assert torch.allclose(a[1], b[1], rtol=2e-7, atol=0)
        else:  # the kernel rounds where torch rounds: identical bf16 weights
            assert torch.equal(a[1], b[1])


def test_float64_logits_are_computed_in_float64():
    logits = random_logits(dtype=torch.float64)
    for variant in ALL_VARIANTS:
        ids, w = variant_fn("router_topk", variant)(logits, 2)
        t_ids, t_w = truth(logits, 2)
        assert w.dtype == torch.float64 and torch.equal(ids, t_ids)
        assert torch.allclose(w, t_w, rtol=1e-13, atol=0)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_nan_logits_propagate_to_weights(variant):
    logits = random_logits(n=3)
    logits[1, 2] = float("nan")
    _, w = variant_fn("router_topk", variant)(logits, 2)
    assert torch.isnan(w[1]).all() and torch.isfinite(w[[0, 2]]).all()


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_non_contiguous_logits_are_handled(variant):
    logits = random_logits(n=8, e=6)
    lt = logits.T.contiguous().T
    assert not lt.is_contiguous()
    a, b = variant_fn("router_topk", variant)(lt, 2), variant_fn("router_topk", variant)(logits, 2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_bad_inputs_raise(variant):
    f = variant_fn("router_topk", variant)
    logits = random_logits(n=4, e=8)
    with pytest.raises(ValueError, match=r"num_experts=8.*logits\[4, 8\].*got 9"):
        f(logits, 9)
    with pytest.raises(ValueError, match="k must be"):
        f(logits, 0)
    with pytest.raises(ValueError, match=r"logits\[8\].*\[N, E\]"):
        f(logits[0], 2)
    with pytest.raises(ValueError, match="scoring"):
        f(logits, 2, scoring="relu")
    with pytest.raises(TypeError, match="compute_dtype"):
        f(logits, 2, compute_dtype=torch.int32)


# --- router replay -----------------------------------------------------------------------


def test_replay_gate_equals_routing_weights_on_its_own_selection():
    logits = random_logits()
    for scoring in ("softmax", "sigmoid"):
        ids, w = kernels.get("router_topk", "stable")(logits, 2, scoring=scoring)
        assert torch.allclose(kernels.replay_gate(logits, ids, scoring=scoring), w, rtol=1e-6, atol=0)


def test_replay_gate_keeps_router_gradients():
    """Replayed selection (from another engine), fresh logits: the gate still trains the router."""
    logits = random_logits(n=6, dtype=torch.float64).requires_grad_()
    replayed = torch.tensor([[7, 0], [1, 2], [3, 3], [5, 4], [6, 1], [0, 7]])
    gate = kernels.replay_gate(logits, replayed)
    (gate * torch.arange(12.0, dtype=torch.float64).view(6, 2)).sum().backward()
    assert (logits.grad.abs().sum(dim=1) > 0).all()
    for scoring, renorm in (("softmax", True), ("softmax", False), ("sigmoid", True)):
        fn = lambda z: kernels.replay_gate(z, replayed, scoring=scoring, renormalize=renorm)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (logits.detach().requires_grad_(),))


def test_replay_gate_softmax_is_over_all_experts():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=torch.float64)
    gate = kernels.replay_gate(logits, torch.tensor([[0, 1]]), renormalize=False)
    p = torch.softmax(logits, -1)
    assert torch.allclose(gate, p[:, :2])
    assert torch.allclose(kernels.replay_gate(logits, torch.tensor([[0, 1]])), p[:, :2] / p[:, :2].sum())


def test_replay_gate_bad_ids():
    logits = random_logits(n=4, e=8)
    with pytest.raises(ValueError, match=r"ids\[4, 2\].*\[0, 8\)"):
        kernels.replay_gate(logits, torch.full((4, 2), 8))
    with pytest.raises(ValueError, match=r"logits\[4, 8\].*ids\[3, 2\]"):
        kernels.replay_gate(logits, torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"ids\[4, 2\] float32"):
        kernels.replay_gate(logits, torch.zeros(4, 2))


def test_torch_variant_equals_stable_without_ties_and_is_plain_topk_with_ties():
    import kernels

    torch.manual_seed(0)
    logits = torch.randn(64, 8, dtype=torch.float64)  # no exact ties
    for name in ("torch", "stable"):
        ids, w = kernels.get("router_topk", name)(logits, 2)
        if name == "torch":
            ref_ids, ref_w = ids, w
    assert torch.equal(ids, ref_ids) and torch.equal(w, ref_w)
    tied = torch.zeros(4, 8)  # every expert ties: the result is whatever torch.topk returns
    ids, _ = kernels.get("router_topk", "torch")(tied, 2)
    assert torch.equal(ids, torch.topk(torch.softmax(tied, -1), 2, dim=-1).indices)
