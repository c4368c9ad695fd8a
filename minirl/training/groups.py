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

A group source gets ``RolloutInputs`` (the engine, tokenizer, problems and verifier), not the
``Trainer``: what it may touch is written down, and a test can stub each piece.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minirl.algorithms.roc import roc_select
from minirl.algorithms.zero_variance import ZeroVarianceMonitor, dynamic_filter, zero_variance_rate
from minirl.engine.sampling import SamplingParams
from minirl.engines import RolloutEngine
from minirl.tasks import Problem
from minirl.tasks.tool_calls import multi_turn_rollout
from minirl.training.sft import encode
from minirl.training.train_config import TrainConfig


@dataclass
class RolloutInputs:
    """What a group source (and the held-out evaluation) draws on: the rollout engine, the
    tokenizer, the run's problem stream and the verifier. One object shared by the trainer and its
    group source, so an engine or training set the trainer swaps in reaches both."""

    engine: RolloutEngine
    tokenizer: Any
    problems: Callable[[int], list[Problem]]  # step -> that step's problems, in the run's data order
    train_set: list[Problem]  # where ``zero_variance: filter`` draws its extra prompts
    verify: Callable[[Problem, str], tuple[float, bool]]  # completion text -> (reward, verifier raised)
    tools: tuple[int, float] | None = None  # a tool task's (model turns, seconds per call); None = single-turn

    def prompt(self, problem: Problem) -> list[int]:
        return encode(self.tokenizer, problem.prompt)[0]

    def score(self, problem: Problem, token_ids: list[int]) -> tuple[float, bool]:
        """(reward, verifier raised) of generated tokens."""
        return self.verify(problem, self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[tuple[Any, str]]:
        """``params.n`` completions per prompt (prompt-major) with the text the verifier reads: one
        engine call, or for a tool task multi-turn trajectories whose ``<tool_call>`` code runs in
        the sandbox between turns (the text then holds the model turns and the tool responses)."""
        tok = self.tokenizer
        if self.tools is None:
            return [(r, tok.decode(r.token_ids, skip_special_tokens=True)) for r in self.engine.generate(prompts, params)]
        max_turns, timeout_s = self.tools
        trajs = multi_turn_rollout(self.engine, lambda text: tok(text)["input_ids"],
                                   lambda ids: tok.decode(ids, skip_special_tokens=True),
                                   [p for p in prompts for _ in range(params.n)], params, max_turns=max_turns,
                                   timeout_s=timeout_s)
        return [(t, t.text) for t in trajs]


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
    """``collect(step)`` for ``rollout: sync``; holds the adaptive group size across steps.
    ``logged()`` gives the run's metric rows so far (a resumed run's adaptive N continues from them)."""

    def __init__(self, config: TrainConfig, inputs: RolloutInputs, logged: Callable[[], list[dict]]) -> None:
        self.cfg, self.inputs, self.logged = config, inputs, logged
        self.monitor: ZeroVarianceMonitor | None = None

    def collect(self, step: int, seed: int) -> Drawn:
        """Step ``step``'s groups, sampled with engine seed ``seed``."""
        c = self.cfg
        g = self._monitor().n if c.adaptive_group else c.group_size
        first = self.sample(self.inputs.problems(step), g, seed)
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
        if self.inputs.tools is not None:
            metrics.update(_tool_metrics([r for x in first for r in x.rollouts]))
        return Drawn.of(kept, g, metrics)

    def sample(self, problems: list[Problem], g: int, seed: int) -> list[Group]:
        """``g`` scored rollouts per problem (2g drawn and g kept with ``downsample: roc``)."""
        c, inputs = self.cfg, self.inputs
        n = 2 * g if c.downsample == "roc" else g
        params = SamplingParams(n=n, max_new_tokens=c.max_new_tokens, temperature=c.temperature, seed=seed)
        outs = inputs.generate([inputs.prompt(p) for p in problems], params)
        gen = torch.Generator().manual_seed(seed)
        groups = []
        for i, p in enumerate(problems):
            members = outs[i * n:(i + 1) * n]
            scored = [inputs.verify(p, text) for _, text in members]
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
            self.monitor.replay([r["zero_variance_rate"] for r in self.logged() if "zero_variance_rate" in r])
        return self.monitor

    def _extra_problems(self, step: int, k: int) -> list[Problem]:
        """Draw ``k`` of ``zero_variance: filter``: fresh training prompts, seeded by (run, step, k)."""
        rng = random.Random(f"zero-variance draw {self.cfg.seed} {step} {k}")
        return rng.sample(self.inputs.train_set, min(self.cfg.prompts_per_step, len(self.inputs.train_set)))


def _tool_metrics(trajs: list[Any]) -> dict[str, float]:
    """Per trajectory of the step's groups (after RoC): tool calls, the share of calls that
    failed (rStar2-Agent Eq. 4's errors / calls), model turns."""
    calls = sum(len(t.results) for t in trajs)
    return {"tool_calls": calls / len(trajs), "tool_error_ratio": sum(t.n_tool_errors for t in trajs) / max(calls, 1),
            "tool_turns": sum(t.n_turns for t in trajs) / len(trajs)}
