"""Real vLLM as minirl's rollout engine: raw logprobs of the sampled tokens, vLLM's own routed
experts (R3), weight sync after every update, and a short RL run whose reward rises."""

from __future__ import annotations

import pytest
import torch

from minirl.vllm.rollouts import VllmRollouts
from minirl.engines import load_hf
from minirl import SamplingParams, train
from minirl.training.trainer_forward import forward, trainer_logprobs
from minirl.training.train_config import TrainConfig
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm


def config(moe: str, tmp_path, **changes) -> TrainConfig:
    base = dict(model=moe, sft_steps=100, task="arithmetic", task_kwargs={"digits": 1}, n_train=8, n_eval=4,
                prompts_per_step=8, group_size=8, max_new_tokens=4, steps=8, lr=1e-3, minibatches=2, eval_every=0,
                checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False)
    return TrainConfig(**{**base, **changes})


def test_rollouts_carry_raw_logprobs_of_the_sampled_tokens(zoo, vllm_llm):
    path = zoo("tiny-qwen3-moe")
    engine = VllmRollouts(vllm_llm("tiny-qwen3-moe", "float32"))
    prompts = [[5, 17, 42, 9], [7, 7, 300]]
    outs = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=1.0, seed=0))
    assert [o.prompt_ids for o in outs] == [prompts[0]] * 3 + [prompts[1]] * 3  # prompt-major
    hf = load_hf(path, "float32")
    for o in outs:
        seq = o.prompt_ids + o.token_ids
        with torch.no_grad():
            logp = hf(torch.tensor([seq])).logits[0].float().log_softmax(-1)  # [S, V]
        ref = logp[len(o.prompt_ids) - 1:-1].gather(1, torch.tensor(o.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(o.logprobs, ref, rtol=0, atol=1e-4)  # raw: temperature 1 is not applied
        assert o.finish_reason in ("stop", "length")


def test_seeded_rollouts_beyond_one_steps_token_budget(vllm_llm):
    """128 seeded rollouts of 45-token prompts (5,760 prefill tokens, over the 4,096 of one step)
    crashed vLLM's CPU runner ("CPU Generator does not use offset") when it chunked a prefill:
    ``adaptive_group`` at N = 32 on the real-model recipe. Prefills are now scheduled whole."""
    llm = vllm_llm("tiny-qwen3-moe", "float32")
    engine = VllmRollouts(llm)
    prompts = [list(range(3 + i, 48 + i)) for i in range(4)]
    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    assert budget < 32 * sum(map(len, prompts))  # the case that chunked
    params = SamplingParams(n=32, max_new_tokens=4, temperature=1.0, seed=3)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    assert len(first) == 128 and [o.prompt_ids for o in first[::32]] == prompts
    assert [o.token_ids for o in first] == [o.token_ids for o in again]  # the seed still decides


def test_short_rl_run_with_vllm_rollouts_raises_reward(zoo, tmp_path, capfd):
    """``engine: vllm`` in the config: the spec reaches VllmRollouts through build_engine, and with
    ``progress: false`` vLLM's checkpoint-loading bar is not drawn (it was: the engine was built
    outside the trainer's ``quiet``)."""
    cfg = config(str(zoo("tiny-qwen3-moe")), tmp_path, engine="vllm,max_model_len=256")
    rewards = [r["reward"] for r in train(cfg).rows]
    assert "Loading safetensors checkpoint shards" not in capfd.readouterr().err
    before, after = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"\nvLLM rollouts: reward first 3 steps {before:.3f} -> last 3 steps {after:.3f}: {rewards}")
    assert after > before + 0.05


def _replay_rows(rollouts) -> list[torch.Tensor]:
    return [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts]


def test_rollouts_carry_vllms_routed_experts(zoo, vllm_llm):
    """fp32 vLLM routes like fp32 transformers, and replaying its experts in the trainer gives
    the engine's logprobs (R3 with an aligned engine: no gap)."""
    path = zoo("tiny-qwen3-moe")
    engine = VllmRollouts(vllm_llm("tiny-qwen3-moe", "float32"))
    assert engine.returns_routed_experts
    outs = engine.generate([[5, 17, 42, 9], [7, 7, 300]], SamplingParams(n=3, max_new_tokens=8, temperature=1.0,
                                                                         seed=0))
    hf = load_hf(path, "float32")
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    routed = _replay_rows(outs)
    with torch.no_grad():
        own = forward(hf, seqs, record_routing=True).routing  # the trainer's own choices
        replayed = trainer_logprobs(hf, seqs, routed)
    for o, r, mine, logp in zip(outs, routed, own, replayed):
        assert r.shape == (len(o.prompt_ids) + len(o.token_ids), 4, 2) and r.dtype == torch.int64
        same = (r[:-1].sort(-1).values == mine[:-1].sort(-1).values).all(-1).float().mean()
        assert same > 0.95, f"fp32 vLLM and fp32 transformers chose the same experts at only {same:.0%} of rows"
        torch.testing.assert_close(logp[len(o.prompt_ids) - 1:], o.logprobs, rtol=0, atol=1e-4)


def test_r3_narrows_the_gap_to_bf16_vllm(zoo, vllm_llm):
    """CompassMax §2.4.4 with real vLLM rollouts: the factor is printed (docs/rl.md quotes it)."""
    engine = VllmRollouts(vllm_llm("tiny-qwen3-moe", "bfloat16"))
    prompts = [[1, 51, 28, 277, 13, 25, 31, 259, 28], [1, 51, 28, 40, 41, 13], [1, 80, 81, 82]]
    outs = engine.generate(prompts, SamplingParams(n=6, max_new_tokens=32, temperature=1.0, seed=0, ignore_eos=True))
    hf = load_hf(zoo("tiny-qwen3-moe"), "float32")
    seqs = [o.prompt_ids + o.token_ids for o in outs]

    def gap(routed):
        with torch.no_grad():
            got = trainer_logprobs(hf, seqs, routed)
        return torch.cat([(g[len(o.prompt_ids) - 1:] - o.logprobs).abs() for g, o in zip(got, outs)])

    plain, replayed = gap(None), gap(_replay_rows(outs))
    print(f"\nR3 vs bf16 vLLM: |dlogp| mean {plain.mean():.2e} -> {replayed.mean():.2e} "
          f"({plain.mean() / replayed.mean():.2f}x), max {plain.max():.2e} -> {replayed.max():.2e} "
          f"({plain.max() / replayed.max():.2f}x)")
    assert float(replayed.mean()) < float(plain.mean())
    assert float(replayed.max()) <= float(plain.max())


def test_rl_step_with_r3_replays_vllm_routing(zoo, tmp_path, vllm_llm):
    cfg = config(str(zoo("tiny-qwen3-moe")), tmp_path, router_replay="r3", steps=1, sft_steps=0, engine_dtype="float32")
    rows = train(cfg, engine=VllmRollouts(vllm_llm("tiny-qwen3-moe", "float32"))).rows
    assert rows[0]["abs_dlogp_max"] < 1e-3  # aligned fp32 engine + R3: the gap is kernel noise only


def test_c3po_loop_runs_on_vllm_with_prefix_caching(zoo, tmp_path):
    """C3PO++ resumes are new requests over prompt + tokens so far: with vLLM's prefix cache on
    they reuse the KV of the earlier chunks, and weight sync resets that cache."""
    from minirl.driver import train_c3po

    cfg = config(str(zoo("tiny-qwen3-moe")), tmp_path, engine="vllm,prefix_caching=true", prompts_per_step=4,
                 group_size=4, steps=3)
    result = train_c3po(cfg, token_budget=24, chunk_tokens=2)
    trained = [o for rollouts in result.trained for o in rollouts]
    assert trained and all(len(o.versions) == len(o.token_ids) for o in trained)
    assert all(r["nan_skipped"] == 0 for r in result.rows)
    assert any(r["time_update"] > 0 for r in result.rows)


def test_real_vllm_records_audit_aligned_in_fp32_shift_named_and_bf16_numeric(zoo, vllm_llm):
    from tests.real_engine_audit import check_real_engine_records

    check_real_engine_records(VllmRollouts(vllm_llm("tiny-qwen3-moe", "float32")),
                              VllmRollouts(vllm_llm("tiny-qwen3-moe", "bfloat16")), zoo("tiny-qwen3-moe"))
