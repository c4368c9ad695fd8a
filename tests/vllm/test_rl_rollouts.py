"""Real vLLM as minirl's rollout engine: raw logprobs of the sampled tokens, weight sync after
every update, and a short RL run whose reward rises."""

from __future__ import annotations

import pytest
import torch

from aligntools.adapters.vllm_rollouts import VllmRollouts
from aligntools.gates.engine_spec import load_hf
from minirl import SamplingParams, train
from minirl.train_config import TrainConfig
from minirl.trainer import resolve_model
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
        assert o.finish_reason in ("stop", "length") and o.routed_experts is None


def test_short_rl_run_with_vllm_rollouts_raises_reward(zoo, tmp_path):
    cfg = config(str(zoo("tiny-qwen3-moe")), tmp_path)
    engine = VllmRollouts.create(resolve_model(cfg), "bfloat16")
    rewards = [r["reward"] for r in train(cfg, engine=engine).rows]
    before, after = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"\nvLLM rollouts: reward first 3 steps {before:.3f} -> last 3 steps {after:.3f}: {rewards}")
    assert after > before + 0.05


def test_r3_needs_an_engine_that_returns_routed_experts(zoo, tmp_path, vllm_llm):
    cfg = config(str(zoo("tiny-qwen3-moe")), tmp_path, router_replay="r3", steps=1)
    with pytest.raises(ValueError, match="router_replay='r3' replays the rollout engine's routed experts"):
        train(cfg, engine=VllmRollouts(vllm_llm("tiny-qwen3-moe", "bfloat16")))
