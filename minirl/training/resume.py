"""What a resumed run may change.

A checkpoint records the config it was trained with. On ``--resume`` each value that differs is
either *applied* from the resumed step on (``APPLIED``: how long to run, how often to evaluate,
save or monitor, the optimizer's hyper-parameters, where to run) and recorded in the log as an event at that
step, or *refused by name*: anything else changes what the steps already taken computed (model,
task, seed, group size, engine, the objective...), so the resumed run would not be one run.
A field added later is refused until it is listed here: the safe default.
"""

from __future__ import annotations

from pathlib import Path

from minirl.training import attention, checkpointing
from minirl.training.train_config import TrainConfig

APPLIED = ("steps", "eval_every", "checkpoint_every", "monitor_every", "max_nan_steps", "progress", "report_to", "device", "out_dir",
           "record_rollouts", "lr", "weight_decay", "betas", "grad_clip",
           # where ray's workers run and in which order they are served: every sample keeps its seed
           "ray_address", "ray_num_cpus", "rollout_actors", "cpus_per_actor", "connect_timeout_s", "dispatch",
           "draft_tokens", "queue_capacity")
"""keys a resume may change; the others are refused."""


def check(config: TrainConfig, state: dict, path: Path) -> dict[str, tuple]:
    """Refuse resuming ``config`` from the checkpoint at ``path`` whose ``state`` (its state.json)
    it cannot continue: a damaged step or row count, a step beyond ``config.steps``, a refused
    change (``changes``); -> ``{key: (saved, current)}`` of the changes it applies."""
    saved = state.get("config") if isinstance(state.get("config"), dict) else {}
    step, rows = state.get("step"), state.get("rows")
    last = saved.get("steps") if isinstance(saved.get("steps"), int) else config.steps
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= last \
            or not isinstance(rows, list) or len(rows) != step:
        raise checkpointing.CheckpointError(
            f"{path / 'state.json'}: step={step!r} with {len(rows) if isinstance(rows, list) else rows!r} metric "
            f"rows, but a checkpoint of this run has a step in [0, steps={last}] and one row per step; the file "
            f"is damaged: restore it from a copy, or start again with --overwrite")
    if step > config.steps:
        raise ValueError(f"steps={config.steps}, but the checkpoint in {path} is already at step {step}; "
                         f"set steps >= {step}")
    identity = state.get("model_identity")
    same_model = identity == checkpointing.model_identity(config.model) if identity else \
        saved.get("model", config.model) == config.model
    # compare kernels, not `auto`: a run saves what its `auto` resolved to (minirl.training.attention),
    # and a checkpoint whose state kept `auto` (a Ray learner's) resolves the same way for the same model
    if saved.get("trainer_attention") == "auto":
        saved = {**saved, "trainer_attention": attention.resolve("auto", config.model)}
    return changes(saved, attention.resolved(config).to_dict(), same_model)


def check_before_loading(config: TrainConfig) -> None:
    """``check`` on the checkpoint's state.json alone, before any model loads or worker starts: a
    refused resume in ``mode: ray`` otherwise starts every actor (~12 s on 2 cores) to say no."""
    path = Path(config.out_dir) / "checkpoint"
    check(config, checkpointing.read_state(path), path)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says where it stopped and what can be resumed."""


def changes(saved: dict, current: dict, same_model: bool) -> dict[str, tuple]:
    """``{key: (saved, current)}`` of the values a resume applies; raises ``ValueError`` naming
    every refused change. ``model`` is compared by ``same_model`` (the weights' hash), so a moved
    checkpoint directory resumes and another checkpoint at the same path does not."""
    diff = {k: (saved[k], v) for k, v in current.items() if k in saved and k != "model" and _norm(saved[k]) != _norm(v)}
    refused = {k: d for k, d in diff.items() if k not in APPLIED}
    if not same_model:
        refused = {"model": (saved.get("model"), current.get("model")), **refused}
    if refused:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        extra = " (the weights differ from the checkpoint's starting model)" if not same_model else ""
        raise ValueError(f"--resume would change {', '.join(refused)} ({listed}){extra}: these decide what the steps "
                         f"already taken computed, so the result would not be one run. Keep the checkpoint's values "
                         f"(its config is <out_dir>/config.yaml), or start a new run (another out_dir, or "
                         f"--overwrite). A resume may change only: {', '.join(APPLIED)}")
    return {k: d for k, d in diff.items() if k in APPLIED}


def _norm(value: object) -> object:
    """JSON round trips turn tuples into lists; compare them as equal."""
    return [_norm(v) for v in value] if isinstance(value, (list, tuple)) else value
