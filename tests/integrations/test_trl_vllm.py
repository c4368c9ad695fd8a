"""TRL's ``GRPOTrainer`` with real vLLM (CPU build, bf16) rollouts through the lab's rollout_func,
attached: the run trains, and the step's records audit as a numeric (bf16) mismatch only."""

from __future__ import annotations

import os

import pytest

import aligntools
from aligntools.integrations.trl import attach, rollout_func
from tests.integrations.test_trl import grpo

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # 1 GB of KV cache: the tiny model needs far less


@pytest.mark.slow  # vLLM's CPU engine start and 3 TRL steps: ~90 s on the shared 2-core box
def test_trl_with_vllm_bf16_rollouts_audits_numeric(zoo, tmp_path):
    path = zoo("tiny-qwen3-moe")
    trainer, losses = grpo(path, tmp_path, rollout_func("vllm:bfloat16,max_model_len=256"))
    att = attach(trainer, records=tmp_path / "records")
    trainer.train()
    assert len(losses) == 3 and att.last_stats["mismatch/abs_dlogp/mean"] > 0
    result = aligntools.audit(att.records / "step-000000.jsonl", path)
    assert result.verdict == "misaligned"
    assert [c.name for c in result.causes] == ["numeric"]
