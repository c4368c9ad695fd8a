"""Which algorithm switches combine: the one table of refused combinations, checked by
``TrainConfig`` before any model loads, and printed into docs/rl.md (``markdown``).

Every combination not refused here runs in the one trainer loop (``minirl.training.trainer``); the
examples under ``configs/`` are each run by ``tests/minirl/training/test_switches.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minirl import tasks


@dataclass(frozen=True)
class Rule:
    when: str  # the refused combination, as a user writes it
    applies: Callable[[Any], bool]  # TrainConfig -> refused?
    reason: str  # why it cannot work, and what to set instead


def _tools(c: Any) -> bool:
    return tasks.uses_tools(c.task)


def _off_loop(c: Any) -> bool:
    return c.mode in ("async", "ray")


RULES: tuple[Rule, ...] = (
    Rule("`router_replay: r2` with `old_logprobs: bypass`", lambda c: c.router_replay == "r2" and c.old_logprobs == "bypass",
         "R2 records routing in the old-logprob forward, which bypass skips; use router_replay: r3 or "
         "old_logprobs: recompute"),
    Rule("`loss: espo` with `correction` other than none", lambda c: c.loss == "espo" and c.correction != "none",
         "ESPO's loss (minirl.algorithms.espo.espo_loss) takes no per-token correction weights; set correction: none"),
    Rule("`loss: espo` with `old_logprobs: bypass`", lambda c: c.loss == "espo" and c.old_logprobs == "bypass",
         "ESPO groups tokens by the old policy's entropy, which the old-logprob forward computes and bypass skips; "
         "set old_logprobs: recompute"),
    Rule("`zero_variance: reshape` with `old_logprobs: bypass`",
         lambda c: c.zero_variance == "reshape" and c.old_logprobs == "bypass",
         "reshaping shapes advantages by the old policy's token entropy, which bypass never computes; "
         "set old_logprobs: recompute"),
    Rule("`rollout: c3po` with `mode: async` or `ray`", lambda c: c.rollout == "c3po" and _off_loop(c),
         "C3PO++ is itself the rollout schedule (a token budget per update); the async/ray producers schedule whole "
         "steps ahead. Use mode: sync with rollout: c3po"),
    Rule("`rollout: c3po` with `router_replay: r3`", lambda c: c.rollout == "c3po" and c.router_replay == "r3",
         "a resumed C3PO++ rollout is re-prefilled chunk by chunk, so no single rollout-engine routing covers it; "
         "use router_replay: r2 or none"),
    Rule("`rollout: c3po` with `zero_variance: filter` or `adaptive_group`",
         lambda c: c.rollout == "c3po" and (c.zero_variance == "filter" or c.adaptive_group),
         "C3PO++ groups enter the pool as group_size rollouts and finish across iterations under a token budget; "
         "there is no step batch to refill or resize. Use zero_variance: none or reshape"),
    Rule("`rollout: c3po` with a tool task (`python_tool`)", lambda c: c.rollout == "c3po" and _tools(c),
         "C3PO++ advances rollouts by single-turn engine chunks; tool trajectories need a sandbox call between turns. "
         "Use rollout: sync"),
    Rule("`mode: async` or `ray` with `zero_variance: filter` or `adaptive_group`",
         lambda c: _off_loop(c) and (c.zero_variance == "filter" or c.adaptive_group),
         "the producer generates a fixed batch of group_size samples per prompt, steps ahead of the learner that "
         "would decide to draw more or resize; use mode: sync, or zero_variance: reshape"),
    Rule("`mode: async` or `ray` with a tool task (`python_tool`)", lambda c: _off_loop(c) and _tools(c),
         "the async/ray rollout workers generate single-turn; multi-turn tool rollouts run in mode: sync"),
    Rule("`downsample: roc` with a task without tools", lambda c: c.downsample == "roc" and not _tools(c),
         "GRPO-RoC ranks correct rollouts by their tool-error ratio (rStar2-Agent Eq. 4); use task: python_tool "
         "or downsample: none"),
    Rule("a tool task (`python_tool`) with `router_replay: r3`", lambda c: _tools(c) and c.router_replay == "r3",
         "tool responses are tokens the rollout engine never routed, so no engine routing covers a trajectory; "
         "use router_replay: r2"),
    Rule("`adaptive_group` with `adaptive_group_max` < `group_size`",
         lambda c: c.adaptive_group and c.adaptive_group_max < c.group_size,
         "N grows from group_size up to adaptive_group_max; raise adaptive_group_max"),
    Rule("`rollout: c3po` with `c3po_token_budget` < `c3po_chunk_tokens`",
         lambda c: c.rollout == "c3po" and c.c3po_token_budget < c.c3po_chunk_tokens,
         "the budget Φ is checked once per chunk and must cover one; raise c3po_token_budget or lower "
         "c3po_chunk_tokens"),
    Rule("`record_rollouts` with `mode: async` or `ray`, or a tool task (`python_tool`)",
         lambda c: c.record_rollouts and (_off_loop(c) or _tools(c)),
         "the records are written by the sync loop, one sample per single-turn completion (tool-response tokens "
         "were never sampled, so no engine logprob covers them); use mode: sync with a single-turn task"),
    Rule("`shared_prefix` with `router_replay`", lambda c: c.shared_prefix and c.router_replay != "none",
         "router replay's records are per padded sequence, shared_prefix packs one row per prompt; "
         "set shared_prefix: false"),
    Rule("`trainer_forward: per_token` with `shared_prefix` or `router_replay`",
         lambda c: c.trainer_forward == "per_token" and (c.shared_prefix or c.router_replay != "none"),
         "the per-token forward runs each prefix alone, as a recomputing engine does; it neither packs prompts nor "
         "replays or records routing. Set shared_prefix: false and router_replay: none, or trainer_forward: batched"),
)


def check(config: Any) -> None:
    """Refuse a combination in ``RULES``, naming it and the fix (each switch's own values and
    ranges are checked before, by ``TrainConfig`` and ``minirl.training.config_check``)."""
    for rule in RULES:
        if rule.applies(config):
            raise ValueError(f"{rule.when.replace('`', '')} does not combine: {rule.reason}")


def markdown() -> str:
    """The refused combinations as a markdown table (docs/rl.md holds this text; a test compares)."""
    lines = ["| refused combination | why, and what to set instead |", "|---|---|"]
    return "\n".join(lines + [f"| {r.when} | {r.reason} |" for r in RULES]) + "\n"
