"""The lab on a verl batch: records and mismatch statistics from one training step, in one call::

    from aligntools.integrations.verl import record_batch
    # in RayPPOTrainer.fit, after ``batch = batch.union(old_log_prob)``:
    metrics.update(record_batch(batch, self.global_steps, records="runs/records"))

Why a function and not a hook: verl has no hook at that point of its loop, and with
``actor_rollout_ref.rollout.calculate_log_probs=True`` that point is where one batch holds both
sides: ``rollout_log_probs`` (the engine's) and ``old_log_probs`` (the actor's recompute), with
``prompts``, ``responses``, ``attention_mask``, ``response_mask`` and, under R3, ``routed_experts``.
verl's own ``rollout_data_dir`` dumps keep text and scores only, so they cannot be audited.
Tested against batches with verl's documented keys (verl is not installed here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aligntools.integrations.stats import mismatch_stats, write_step
from aligntools.records import from_object

NEEDED = ("prompts", "responses", "attention_mask", "rollout_log_probs", "old_log_probs")


def record_batch(batch: Any, step: int, records: str | Path | None = None,
                 sampling: Mapping[str, float] | None = None, logprobs_mode: str | None = None) -> dict[str, float]:
    """``batch``: a verl ``DataProto`` (its ``.batch`` is read) or a dict of its tensors. Writes its samples
    as records to ``records/step-NNNNNN.jsonl`` (None: statistics only) and returns the ``mismatch/...``
    statistics (``aligntools.integrations.stats``) for verl's ``metrics`` dict.

    ``sampling`` (e.g. ``{"temperature": rollout.temperature}``) and ``logprobs_mode`` (``"raw"`` or
    ``"processed"``: how the rollout engine was asked for logprobs) go into every record: the audit
    compares them with what the logprobs show.
    """
    tensors = _tensors(batch)
    n_resp = tensors["responses"].shape[1]
    mask = tensors.get("response_mask", tensors["attention_mask"][:, -n_resp:])  # [B, R]
    stats = mismatch_stats(tensors["old_log_probs"], tensors["rollout_log_probs"], mask)
    if records is not None:
        recs = from_object({k: v for k, v in tensors.items() if k != "old_log_probs"}, "verl batch")
        recs = [dataclasses.replace(r, step=step, sampling=dict(sampling or {}), logprobs_mode=logprobs_mode)
                for r in recs]
        write_step(recs, records, step)
    return stats


def _tensors(batch: Any) -> dict[str, Any]:
    """The batch's tensors by name (a ``DataProto``'s ``TensorDict`` is not a ``Mapping``)."""
    source = batch.batch if hasattr(batch, "batch") else batch
    tensors = {k: source[k] for k in source.keys()}
    missing = [k for k in NEEDED if k not in tensors]
    if missing:
        raise KeyError(f"record_batch: the batch has no {', '.join(missing)}; set "
                       "actor_rollout_ref.rollout.calculate_log_probs=True and call it after "
                       "batch.union(old_log_prob), where both logprobs are in the batch")
    return tensors
