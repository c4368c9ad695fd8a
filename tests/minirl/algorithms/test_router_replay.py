"""trainer_logprobs and router replay (R3 / R2) on the zoo Qwen3-MoE."""

from __future__ import annotations

import pytest
import torch

from minirl import Engine, Knobs, SamplingParams

from minirl.algorithms import router_replay
from minirl.training.trainer_forward import forward, trainer_logprobs

PROMPTS = [[1, 51, 28, 277, 13, 25, 31, 259, 28], [1, 51, 28, 40, 41, 13], [1, 80, 81, 82]]


def _rollouts(path, dtype, knobs, n=4, tokens=24):
    engine = Engine.from_pretrained(path, dtype, knobs)
    return engine.generate(PROMPTS, SamplingParams(n=n, max_new_tokens=tokens, temperature=1.0, seed=0,
                                                   ignore_eos=True))


def _gap(model, rollouts, replay: bool) -> torch.Tensor:
    """|trainer - engine| logprob on every generated token, [N]."""
    seqs = [r.prompt_ids + r.token_ids for r in rollouts]
    routed = [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts] if replay else None
    got = trainer_logprobs(model, seqs, routed)
    return torch.cat([(g[len(r.prompt_ids) - 1:] - r.logprobs).abs() for g, r in zip(got, rollouts)])


def test_trainer_logprobs_layout_matches_hf(hf_moe):
    seqs = [[1, 51, 28, 277, 13], [1, 40, 41]]
    got = trainer_logprobs(hf_moe, seqs)
    for s, g in zip(seqs, got):
        x = torch.tensor([s])
        want = hf_moe(input_ids=x).logits.float().log_softmax(-1)[0, :-1].gather(1, x[0, 1:, None])[:, 0]
        assert g.dtype == torch.float32 and g.shape == (len(s) - 1,)
        torch.testing.assert_close(g, want, rtol=0, atol=2e-5)


def test_r3_with_aligned_fp32_engine_equals_engine_logprobs(moe_path, hf_moe):
    rollouts = _rollouts(moe_path, "float32", Knobs.aligned(), n=2, tokens=16)
    gap = _gap(hf_moe, rollouts, replay=True)
    assert float(gap.max()) < 3e-5


def test_r3_reduces_gap_against_bf16_engine(moe_path, hf_moe):
    """CompassMax §2.4.4 on the zoo MoE: the factor is printed (docs/rl.md quotes it)."""
    rollouts = _rollouts(moe_path, "bfloat16", Knobs.typical_inference(), n=6, tokens=32)
    plain, replayed = _gap(hf_moe, rollouts, False), _gap(hf_moe, rollouts, True)
    assert float(replayed.mean()) < float(plain.mean())
    assert float(replayed.max()) <= float(plain.max())
    print(f"\nR3 vs bf16 engine: |dlogp| mean {plain.mean():.2e} -> {replayed.mean():.2e} "
          f"({plain.mean() / replayed.mean():.2f}x), max {plain.max():.2e} -> {replayed.max():.2e}")


def test_router_keeps_gradient_under_replay(hf_moe):
    seqs = [[1, 51, 28, 277, 13, 25]]
    with torch.no_grad():
        rec = forward(hf_moe, seqs, record_routing=True).routing
    hf_moe.zero_grad()
    out = forward(hf_moe, seqs, rec)
    out.logp.sum().backward()
    gate = router_replay.routers(hf_moe)[0].weight
    assert gate.grad is not None and float(gate.grad.abs().sum()) > 0
    hf_moe.zero_grad()


def test_r2_record_then_replay_is_identity(hf_moe, moe_path):
    """Replay takes the recorded experts but recomputes their gate weights (``kernels.replay_gate``),
    so the replayed forward is the recorded one up to fp32 rounding, whose size is this CPU's (BLAS,
    SIMD width), not a fixed number. ``noise``: the recorded fp32 forward's distance to the same
    recording forward of a float64 copy (no replay in it, so a wrong replay cannot widen the bound),
    floored at one ulp of the largest logprob (the float64 logprobs are stored as fp32). Both fp32
    runs sit about ``noise`` from the exact values, so at most ~2 ``noise`` apart; 4 ``noise`` leaves
    room for the replayed run's own error being the larger, and stays far below what a wrong expert
    or gate weight moves (1e-2 and up)."""
    import transformers

    seqs = [[1, 51, 28, 277, 13, 25, 31], [1, 40, 41]]
    hf64 = transformers.AutoModelForCausalLM.from_pretrained(  # grouped_mm has no float64 kernel: eager
        moe_path, dtype=torch.float64, experts_implementation="eager").eval()
    with torch.no_grad():
        rec = forward(hf_moe, seqs, record_routing=True)
        again = forward(hf_moe, seqs, rec.routing)
        exact = forward(hf64, seqs, record_routing=True)
    assert rec.routing[0].shape == (7, len(router_replay.routers(hf_moe)), 2)
    assert all(map(torch.equal, exact.routing, rec.routing)), "a near-tie top-k: float64 routes otherwise"
    eps = torch.finfo(torch.float32).eps
    noise = max(float((rec.logp - exact.logp).abs().max()), eps * float(exact.logp.abs().max()))
    torch.testing.assert_close(again.logp, rec.logp, rtol=0, atol=4 * noise)


def test_replay_entries_consumed_exactly_once(hf_moe):
    ids = [torch.zeros(3, 2, dtype=torch.long) + torch.tensor([0, 1])] * len(router_replay.routers(hf_moe))
    x = torch.tensor([[1, 2, 3]])
    with pytest.raises(RuntimeError, match="called twice"), torch.no_grad():
        with router_replay.replay(hf_moe, ids):
            hf_moe.base_model(input_ids=x)
            hf_moe.base_model(input_ids=x)
    with pytest.raises(RuntimeError, match="never consumed"):
        with router_replay.replay(hf_moe, ids):
            pass
    # the patch is gone after an error: a plain forward works
    with torch.no_grad():
        hf_moe.base_model(input_ids=x)


def test_bad_routed_experts_shape(hf_moe):
    with pytest.raises(ValueError, match="prompt_routed_experts"):
        trainer_logprobs(hf_moe, [[1, 2, 3]], [torch.zeros(2, 4, 2, dtype=torch.long)])


def test_final_row_of_replayed_experts_changes_no_logprob(hf_moe):
    """vLLM never feeds the final sampled token, so its R3 rows repeat the row before: allowed only
    because the final position predicts nothing the trainer scores (causal attention)."""
    seqs = [[1, 51, 28, 277, 13, 25]]
    with torch.no_grad():
        rec = forward(hf_moe, seqs, record_routing=True).routing[0]  # [6, n_moe, k]
        other = rec.clone()
        other[-1] = (rec[-1] + 1) % hf_moe.config.num_experts  # different experts at the final position
        a, b = trainer_logprobs(hf_moe, seqs, [rec]), trainer_logprobs(hf_moe, seqs, [other])
    assert not torch.equal(rec, other)
    # grouped expert GEMMs regroup tokens when one row's experts change: last-bit noise only
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-5)
