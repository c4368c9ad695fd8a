"""The mismatch monitor on real vLLM rollouts: ``engine: vllm`` with ``monitor_every`` captures the
LLM that generated the rollouts (``VllmRollouts.llm``) after each weight sync."""

from __future__ import annotations

import numpy as np

from minirl import train
from minirl.training import run_log
from minirl.training.train_config import TrainConfig
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm


def test_monitor_reads_vllm_rollouts_after_each_sync(zoo, tmp_path):
    cfg = TrainConfig(model=str(zoo("tiny-qwen3-moe")), sft_steps=100, task="arithmetic", task_kwargs={"digits": 1},
                      n_train=8, n_eval=4, prompts_per_step=2, group_size=4, max_new_tokens=4, steps=2, lr=1e-2,
                      eval_every=0, checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False,
                      engine="vllm,max_model_len=256", engine_dtype="float32", monitor_every=1)
    ds = run_log.load(train(cfg).log_path)
    assert ds["monitor_step"].values.tolist() == [0, 1, 2]
    rel = ds["monitor_rel_l2"].values
    assert np.isfinite(rel).all() and rel.max() < 1e-3  # fp32 vLLM serves the trainer's weights at every reading
    assert ds["layer"].values.tolist() == [0, 1, 2, 3] and np.isfinite(ds["monitor_routing_flips"].values).all()
