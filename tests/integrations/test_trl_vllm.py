"""TRL's ``GRPOTrainer`` with real vLLM (CPU build, bf16) rollouts through the lab's rollout_func,
attached with the per-site monitor: the run trains 3 steps, the monitor reads the vLLM engine that
generated, and the step's records audit as a numeric (bf16) mismatch only.

Part of ``make test``: its cost is vLLM's import and engine start (the tiny model's 3 steps, 8
completions of <= 8 tokens each, are a few seconds); docs/measurements/2026-12-07-trl.md has the
numbers."""

from __future__ import annotations

import os

import aligntools
from aligntools.integrations.trl import attach, rollout_func
from minirl.training import run_log
from tests.integrations.test_trl import grpo
from tests.vllm.needs import needs_vllm

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # 1 GB of KV cache: the tiny model needs far less


@needs_vllm
def test_trl_with_vllm_bf16_rollouts_audits_numeric(zoo, tmp_path):
    path = zoo("tiny-qwen3-moe")
    trainer, losses = grpo(path, tmp_path, rollout_func("vllm:bfloat16,max_model_len=256"))
    att = attach(trainer, records=tmp_path / "records", monitor_every=2)
    trainer.train()
    assert len(losses) == 3 and att.last_stats["mismatch/abs_dlogp/mean"] > 0
    result = aligntools.audit(att.records / "step-000000.jsonl", path)
    assert result.verdict == "misaligned"
    assert [c.name for c in result.causes] == ["numeric"]
    ds = run_log.load(att.records / "metrics.nc")  # the monitor read the vLLM engine, at step 0 and 2
    assert ds["monitor_step"].values.tolist() == [0, 2]
    assert (ds["monitor_rel_l2"].values > 0).all()  # bf16 vLLM vs the fp32 trainer: every site differs
