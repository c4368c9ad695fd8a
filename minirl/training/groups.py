"""Where a synchronous step's GRPO groups come from (``rollout: sync``; C3PO++ is
``minirl.training.c3po_loop``): sample ``group_size`` rollouts per prompt under the current weights and
score them, with the switches that change *which* groups are trained on:

* a tool task (``python_tool``): each rollout is multi-turn, the model's ``<tool_call>`` code
  runs in ``minirl.sandbox`` between turns (``minirl.tasks.tool_calls.multi_turn_rollout``, rStar2-Agent
  §2.2.2); tool-response tokens are context, masked out of the loss;
* ``downsample: roc``: 2G rollouts per prompt, ``minirl.algorithms.roc.roc_select`` keeps G (§2.2.3);
* ``zero_variance: filter``: groups with equal rewards are dropped and more prompts drawn until
  ``prompts_per_step`` informative groups (DAPO dynamic sampling, CompassMax §2.4.1);
* ``adaptive_group``: the group size follows the zero-variance rate (``ZeroVarianceMonitor``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from minirl.engine.sampling import SamplingParams
from minirl.algorithms.roc import roc_select
from minirl.training.sft import encode
from minirl.tasks import Problem
from minirl.tasks.tool_calls import multi_turn_rollout
from minirl.algorithms.zero_variance import ZeroVarianceMonitor, dynamic_filter, zero_variance_rate

if TYPE_CHECKING:
    from minirl.training.trainer import Trainer


@dataclass
class Group:
    """One prompt's kept rollouts (``minirl.Rollout`` or ``minirl.tasks.tool_calls.ToolTrajectory``) and
    their verifier rewards; ``errors`` counts verifiers that raised."""

    problem: Problem
    rollouts: list[Any]
    rewards: list[float]
    errors: int = 0


@dataclass
class Drawn:
    """What a step trains on: prompt-major rollouts, ``group_size`` per prompt (none when no
    group qualified: the step then makes no update), and the rollout-side metrics."""

    rollouts: list[Any]
    rewards: torch.Tensor
    group_size: int
    errors: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, groups: list[Group], group_size: int, metrics: dict[str, float]) -> "Drawn":
        return cls([r for g in groups for r in g.rollouts], torch.tensor([x for g in groups for x in g.rewards]),
                   group_size, sum(g.errors for g in groups), metrics)


class SyncGroups:
    """``collect(step)`` for ``rollout: sync``; holds the adaptive group size across steps."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.cfg = trainer, trainer.cfg
        self.monitor: ZeroVarianceMonitor | None = None

    def collect(self, step: int, seed: int) -> Drawn:
        """Step ``step``'s groups, sampled with engine seed ``seed``."""
        c = self.cfg
        g = self._monitor().n if c.adaptive_group else c.group_size
        first = self.sample(self.trainer.problems(step), g, seed)
        metrics = {"zero_variance_rate": zero_variance_rate([x.rewards for x in first])}
        kept = first
        if c.zero_variance == "filter":
            k = 0

            def batch() -> list[Group]:  # the step's own prompts first, then fresh ones
                nonlocal k
                k += 1
                if k == 1:
                    return first
                return self.sample(self._extra_problems(step, k - 1), g, (seed * 1009 + k) % 2 ** 62)

            result = dynamic_filter(batch, lambda x: x.rewards, c.prompts_per_step, c.zero_variance_max_batches)
            kept = result.groups
            # ``reward`` stays the step's own prompts' mean (comparable across runs), not the filtered batch's
            metrics.update(zero_variance_batches=float(result.n_batches), trained_groups=float(len(kept)),
                           reward=sum(sum(x.rewards) for x in first) / sum(len(x.rewards) for x in first))
        if c.adaptive_group:
            metrics.update(self.monitor.update([x.rewards for x in first]))
        if self.trainer.task_uses_tools:
            metrics.update(_tool_metrics([r for x in first for r in x.rollouts]))
        return Drawn.of(kept, g, metrics)

    def sample(self, problems: list[Problem], g: int, seed: int) -> list[Group]:
        """``g`` scored rollouts per problem (2g drawn and g kept with ``downsample: roc``)."""
        c, trainer = self.cfg, self.trainer
        n = 2 * g if c.downsample == "roc" else g
        prompts = [encode(trainer.tokenizer, p.prompt)[0] for p in problems]
        params = SamplingParams(n=n, max_new_tokens=c.max_new_tokens, temperature=c.temperature, seed=seed)
        outs = generate(trainer, prompts, params)
        gen = torch.Generator().manual_seed(seed)
        groups = []
        for i, p in enumerate(problems):
            members = outs[i * n:(i + 1) * n]
            scored = [trainer.verify(p, text) for _, text in members]
            rollouts, rewards = [r for r, _ in members], [s for s, _ in scored]
            if c.downsample == "roc":
                keep = roc_select(rewards, [t.p_err + t.p_format for t in rollouts], g, generator=gen, mode=c.roc_mode)
                rollouts, rewards = [rollouts[k] for k in keep], [rewards[k] for k in keep]
            groups.append(Group(p, rollouts, rewards, sum(e for _, e in scored)))
        return groups

    def _monitor(self) -> ZeroVarianceMonitor:
        """Built on first use from the logged rates, so a resumed run continues the same N."""
        if self.monitor is None:
            c = self.cfg
            self.monitor = ZeroVarianceMonitor(n=c.group_size, n_min=c.group_size, n_max=c.adaptive_group_max)
            self.monitor.replay([r["zero_variance_rate"] for r in self.trainer.log.rows if "zero_variance_rate" in r])
        return self.monitor

    def _extra_problems(self, step: int, k: int) -> list[Problem]:
        """Draw ``k`` of ``zero_variance: filter``: fresh training prompts, seeded by (run, step, k)."""
        rng = random.Random(f"zero-variance draw {self.cfg.seed} {step} {k}")
        return rng.sample(self.trainer.train_set, min(self.cfg.prompts_per_step, len(self.trainer.train_set)))


def generate(trainer: Trainer, prompts: list[list[int]], params: SamplingParams) -> list[tuple[Any, str]]:
    """``params.n`` completions per prompt (prompt-major) with the text the verifier reads: one
    engine call, or for a tool task multi-turn trajectories whose ``<tool_call>`` code runs in the
    sandbox between turns (the text then holds the model turns and the tool responses)."""
    tok, c = trainer.tokenizer, trainer.cfg
    if not trainer.task_uses_tools:
        rollouts = trainer.engine.generate(prompts, params)
        return [(r, tok.decode(r.token_ids, skip_special_tokens=True)) for r in rollouts]
    trajs = multi_turn_rollout(trainer.engine, lambda text: tok(text)["input_ids"],
                               lambda ids: tok.decode(ids, skip_special_tokens=True),
                               [p for p in prompts for _ in range(params.n)], params, max_turns=c.tool_max_turns,
                               timeout_s=c.tool_timeout_s)
    return [(t, t.text) for t in trajs]


def _tool_metrics(trajs: list[Any]) -> dict[str, float]:
    """Per trajectory of the step's groups (after RoC): tool calls, the share of calls that
    failed (rStar2-Agent Eq. 4's errors / calls), model turns."""
    calls = sum(len(t.results) for t in trajs)
    return {"tool_calls": calls / len(trajs), "tool_error_ratio": sum(t.n_tool_errors for t in trajs) / max(calls, 1),
            "tool_turns": sum(t.n_turns for t in trajs) / len(trajs)}
