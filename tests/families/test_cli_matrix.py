"""docs/models.md's gate and RL columns, from the commands a user types, family by family.

Per tiny checkpoint of a family vLLM's CPU build serves: ``mlab check --infer vllm:float32``
exits 0 (every site compared, none one-sided), ``vllm:bfloat16`` exits 1 (bf16 differs), and
``mlab train`` with ``engine: vllm`` runs 2 GRPO steps (rollouts, weight sync after the first
update, the trainer's own log-probs). The whole matrix is ``slow`` (about a minute a family);
``make test`` runs the gate CLI on the zoo's MoE (tests/vllm/test_gate_cli.py) and RL on vLLM
(tests/vllm/test_rl_rollouts.py).
"""

from __future__ import annotations

import re

import pytest

from labs.cli import main
from tests.families.conftest import NOT_SERVED, families
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm

RL = """task: arithmetic
task_kwargs: {{digits: 1}}
sft_steps: 0
n_train: 8
n_eval: 0
engine: vllm,max_model_len=128
engine_dtype: bfloat16
prompts_per_step: 2
group_size: 4
max_new_tokens: 4
steps: 2
minibatches: 1
lr: 1.0e-4
eval_every: 0
checkpoint_every: 0
progress: false
model: {model}
out_dir: {out}
"""


@pytest.mark.parametrize("model_type", families(fast=(), skip=NOT_SERVED))
def test_gates_and_two_vllm_rl_steps_from_the_cli(model_type, family_checkpoint, tmp_path, capsys):
    path = family_checkpoint(model_type)
    check = ["check", "--model", str(path), "--tokens", "32"]
    assert main([*check, "--infer", "vllm:float32"]) == 0, capsys.readouterr().out
    compared, total = map(int, re.search(r"(\d+) of (\d+) sites compared", capsys.readouterr().out).groups())
    assert compared == total > 10
    assert main([*check, "--infer", "vllm:bfloat16"]) == 1
    assert re.search(r"first divergence at \S+", capsys.readouterr().out)
    config = tmp_path / "rl.yaml"
    config.write_text(RL.format(model=path, out=tmp_path / "run"))
    assert main(["train", "--config", str(config)]) == 0
    assert (tmp_path / "run" / "metrics.nc").exists()
