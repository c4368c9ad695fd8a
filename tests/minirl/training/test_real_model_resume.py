"""A real model's run survives ``kill -9``: SmolLM2-135M-Instruct (the zoo's, dequantized from
Q4_1) trained by ``mlab train`` in a subprocess, SIGKILLed once its first checkpoint is on disk,
then ``--resume``d, ends bit-identical to an uninterrupted run: same metric rows (timings aside),
same weights, same AdamW state.

The tied-embedding toy in ``test_runs.py`` covers the in-process Ctrl-C path; this one covers what
only a real checkpoint of a real model can break (a 135M-parameter save interrupted by nothing
but the OS, a chat-template tokenizer, the RNG state of a fresh process). Once with minirl's bf16
engine and once with real vLLM rollouts (vLLM's CPU backend holds ~10 GB per process: one
``mlab train`` runs at a time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from minirl.training import run_log

pytestmark = pytest.mark.slow  # three processes that each load a 135M model: minutes on 2 cores

REPO = Path(__file__).resolve().parents[3]
STEPS = 2  # killed after step 1's checkpoint, the resume trains (and evaluates) step 1, then the final policy
# 1-digit sums (SmolLM2 ~73 % right) and 16 tokens ("The answer is 12." fits): groups with mixed rewards,
# so the steps really move the weights (2-digit sums in 8 tokens gave all-wrong groups and zero gradients)
CONFIG = dict(task="chat_arithmetic", task_kwargs={"digits": 1, "second_digits": 1}, sft_steps=0, n_train=16,
              n_eval=4, engine_dtype="bfloat16", prompts_per_step=2, group_size=4,
              max_new_tokens=16, temperature=1.0, correction="icepop", lr=1e-5, minibatches=1, steps=STEPS,
              eval_every=1, checkpoint_every=1, progress=False)


@pytest.fixture
def mlab_train():
    """``mlab_train(config, *flags) -> Popen`` of ``mlab train``; any still running at teardown
    (a failed assertion, a timeout) is killed, so no 135M-model process outlives the test."""
    procs: list[subprocess.Popen] = []

    def start(config: Path, *flags: str) -> subprocess.Popen:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        procs.append(subprocess.Popen([sys.executable, "-m", "labs.cli", "train", "--config", str(config), *flags],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, out


def _write(tmp_path: Path, name: str, model: Path, engine: str) -> tuple[Path, Path]:
    out = tmp_path / name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "engine": engine, "model": str(model), "out_dir": str(out)}))
    return path, out


def _checkpoint_step(out: Path) -> int | None:
    """The step of ``out``'s checkpoint, None before the first one is in place (a save builds it in
    a temporary sibling and renames it, so ``state.json`` there means a complete checkpoint)."""
    state = out / "checkpoint" / "state.json"
    if not state.is_file():
        return None
    return json.loads(state.read_text())["step"]


def _rows(out: Path) -> dict[str, np.ndarray]:
    log = run_log.load(out / "metrics.nc")
    return {k: log[k].values for k in log.data_vars if not k.startswith("time_")} | {"step": log["step"].values}


@pytest.mark.timeout(3600)  # 3 processes x (load 135M + 2 steps + 2 evaluations): 3 min 12 s for vllm on a quiet box
@pytest.mark.parametrize("engine", ["minirl:typical", "vllm"])
def test_smollm2_run_killed_with_sigkill_resumes_bit_exactly(zoo, tmp_path, mlab_train, engine):
    if engine == "vllm":
        pytest.importorskip("vllm", reason="real vLLM's CPU build is part of the Linux x86-64 setup")
    model = zoo("smollm2-135m")
    full_cfg, full_out = _write(tmp_path, "full", model, engine)
    part_cfg, part_out = _write(tmp_path, "part", model, engine)
    _finish(mlab_train(full_cfg))

    proc = mlab_train(part_cfg)
    while _checkpoint_step(part_out) is None:
        assert proc.poll() is None, proc.communicate()[0]  # it must still be running when the checkpoint appears
        time.sleep(0.2)
    killed_at = _checkpoint_step(part_out)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and killed_at < STEPS
    _finish(mlab_train(part_cfg, "--resume"))

    full, part = _rows(full_out), _rows(part_out)
    # one row per step, then the final policy's evaluation in a row of its own (step = STEPS)
    assert full["step"].tolist() == list(range(STEPS + 1)) and full.keys() == part.keys()
    for name in full:
        np.testing.assert_array_equal(part[name], full[name], err_msg=name)  # NaN == NaN here, bit for bit otherwise
    assert np.nanmax(full["grad_norm"]) > 0  # it learned
    assert np.isfinite(full["eval_accuracy"]).sum() == STEPS + 1  # scored before each step and at the end
    for f in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(full_out / "checkpoint" / f), load_file(part_out / "checkpoint" / f)
        assert a.keys() == b.keys() and len(a) > 0
        for key in a:
            assert torch.equal(a[key], b[key]), f"{f}: {key}"
    start = load_file(model / "model.safetensors")
    moved = load_file(full_out / "checkpoint" / "model.safetensors")
    assert any(not torch.equal(moved[k], start[k]) for k in moved if k in start)  # the weights really changed
