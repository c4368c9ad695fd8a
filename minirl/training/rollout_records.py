"""A run's rollouts as audit records (``TrainConfig.record_rollouts``): one JSON Lines file per step,
``<out_dir>/rollouts/step-000003.jsonl``, one record per sample.

Why minirl writes the record itself: minirl never imports aligntools (docs/architecture.md), and the
record is a documented format (docs/audit.md, "The record"), so a run's rollouts are audited as any
framework's are (``mlab audit <out_dir>/rollouts/step-000003.jsonl --model ...``);
tests/minirl/training/test_rollout_records.py checks that ``aligntools.records.read`` reads what this writes.

Why atomic: each step's file is written whole to ``TMP`` and renamed over its name (``os.replace``),
so a run killed at any moment (``kill -9`` included) leaves complete step files and at most the
temporary one, never half a step under a step's name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from minirl.engine.rollout import Rollout
from minirl.training.run_dir import ROLLOUTS, RunDir, RunDirError

TMP = f"{ROLLOUTS}.step.jsonl.tmp"
"""The one temporary file a step is written to before its rename (claimed like ``.metrics.nc.tmp``)."""
LOGPROBS_MODE = "raw"
"""What a ``RolloutEngine`` returns (``minirl.engines.RolloutEngine``: log-softmax before temperature);
an engine that breaks the contract is what the audit's ``temperature`` cause then names."""


def name(step: int) -> str:
    """The step's file, relative to the run directory."""
    return f"{ROLLOUTS}step-{step:06d}.jsonl"


def sampling(temperature: float) -> dict[str, float]:
    """The settings a minirl rollout is sampled with (``SyncGroups.sample``, ``C3poGroups``): the
    run's temperature, no nucleus (top_p 1), no top-k (0: off, as minirl and vLLM read it)."""
    return {"temperature": float(temperature), "top_p": 1.0, "top_k": 0}


def record(rollout: Rollout, settings: dict[str, float], step: int) -> dict:
    """One rollout as a record (docs/audit.md): its ids, the engine's logprob of each sampled token,
    and for an MoE the experts routed at every prompt + completion position ([rows, layers, top_k])."""
    out = {"prompt_ids": [int(t) for t in rollout.prompt_ids], "completion_ids": [int(t) for t in rollout.token_ids],
           "logprobs": rollout.logprobs.tolist(), "sampling": settings, "logprobs_mode": LOGPROBS_MODE,
           "step": int(step)}
    if rollout.routed_experts is not None and rollout.prompt_routed_experts is not None:
        out["routed_experts"] = torch.cat([rollout.prompt_routed_experts, rollout.routed_experts]).tolist()
    return out


def save(run_dir: RunDir, step: int, rollouts: Sequence[Rollout], temperature: float) -> Path:
    """Step ``step``'s records into the locked run directory: both names claimed first (the run's own
    from then on, so ``--overwrite`` removes them), a step file no run of this directory wrote refused."""
    if name(step) not in run_dir.entries and (run_dir.path / name(step)).exists():
        raise RunDirError(f"{run_dir.path / name(step)} exists and no run here wrote it; move it out of "
                          f"{run_dir.path}, or set another out_dir")
    run_dir.claim(TMP, name(step))
    return write(run_dir.path, step, rollouts, sampling(temperature))


def write(out_dir: Path, step: int, rollouts: Sequence[Rollout], settings: dict[str, float]) -> Path:
    """Write step ``step``'s ``rollouts`` to ``out_dir / name(step)``, whole or not at all."""
    tmp, path = out_dir / TMP, out_dir / name(step)
    tmp.parent.mkdir(exist_ok=True)
    body = "".join(json.dumps(record(r, settings, step)) + "\n" for r in rollouts)
    with open(tmp, "w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)
    return path
