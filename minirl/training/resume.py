"""What a resumed run may change.

A checkpoint records the config it was trained with. On ``--resume`` each value that differs is
either *applied* from the resumed step on (``APPLIED``: how long to run, how often to evaluate,
save or monitor, the optimizer's hyper-parameters, where to run) and recorded in the log as an event at that
step, or *refused by name*: anything else changes what the steps already taken computed (model,
task, seed, group size, engine, the objective...), so the resumed run would not be one run.
A field added later is refused until it is listed here: the safe default.
"""

from __future__ import annotations

APPLIED = ("steps", "eval_every", "checkpoint_every", "monitor_every", "max_nan_steps", "progress", "report_to", "device", "out_dir",
           "lr", "weight_decay", "betas", "grad_clip",
           # where ray's workers run and in which order they are served: every sample keeps its seed
           "ray_address", "ray_num_cpus", "rollout_actors", "cpus_per_actor", "connect_timeout_s", "dispatch",
           "draft_tokens", "queue_capacity")
"""keys a resume may change; the others are refused."""


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
