"""rStar2-Agent Fig. 4 in miniature: tool errors inside *correct* trajectories, GRPO vs GRPO-RoC.

Why a scripted policy: the zoo models never learned the ``<tool_call>`` format, so their
rollouts would all be tool-free and wrong. ``ScriptedToolPolicy`` is a tabular softmax policy
with the decisions that matter for Fig. 4 (call the tool cleanly, call it with a bug, send a
malformed call, guess without a tool; after an error: fix, repeat the bug, or guess). It
speaks through the real environment: ``minirl.tasks.tool_calls.multi_turn_rollout`` parses its calls,
``minirl.sandbox.run_python`` runs them (four outcomes), ``minirl.tasks.python_tool.reward`` scores the
answer (outcome-only, Eq. 3), ``minirl.algorithms.roc.roc_select`` picks G of 2G. Only the learner is a
toy: a policy gradient on the table instead of a transformer.

The mechanism the paper describes shows up directly: under plain GRPO a bug followed by a fix
earns the same reward as a clean call, so once "fix after error" is learned the bug rate stops
falling; RoC keeps fewer buggy positives, so the clean call keeps gaining.
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import xarray as xr
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from minirl import SamplingParams
from minirl.algorithms.roc import roc_select
from minirl.engine.rollout import Rollout
from minirl.quiet import quiet_when_asked
from minirl.sandbox.runner import ToolResult, run_python
from minirl.tasks import Problem
from minirl.tasks.python_tool import reward, sample_problems
from minirl.tasks.tool_calls import ToolTrajectory, multi_turn_rollout

ACTIONS = {"start": ("clean", "buggy", "malformed", "guess"), "after_error": ("fix", "buggy", "guess")}
INIT_LOGITS = {"start": (0.0, 1.0, 0.0, 0.5), "after_error": (2.0, 0.0, 0.0)}  # an error-prone base model
GUESS_CORRECT = 0.25  # chance a tool-free guess is right (positives with p_err = 0.5, Eq. 4)
_PROBLEM = re.compile(r"Problem: compute (\d+) \* (\d+) \+ (\d+)\.")
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


def encode(text: str) -> list[int]:
    """Byte-level codec: exact round trip, no tokenizer needed for a scripted policy."""
    return list(text.encode())


def decode(ids: list[int]) -> str:
    return bytes(ids).decode(errors="replace")


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


class ScriptedToolPolicy:
    """A tabular softmax policy behind the engine protocol ``generate(prompts, params)``.

    The state is read from the context (has a tool response come back, and was it an error);
    ``decisions(traj)`` recovers the (state, action) pairs from a finished trajectory's text.
    """

    def __init__(self, seed: int = 0) -> None:
        self.logits = {s: torch.tensor(v, dtype=torch.float64) for s, v in INIT_LOGITS.items()}
        self.rng = random.Random(seed)

    def probs(self, state: str) -> torch.Tensor:
        return self.logits[state].softmax(-1)

    def _turn(self, context: str) -> str:
        m = _PROBLEM.search(context)
        a, b, c = map(int, m.groups())
        responses = _RESPONSE.findall(context, m.end())  # the instructions show the tags too
        last = responses[-1] if responses else None
        if last is not None and last.strip().isdigit():
            return f"<answer>{last.strip()}</answer>"  # a tool result came back: report it
        state = "start" if last is None else "after_error"
        action = self.rng.choices(ACTIONS[state], weights=self.probs(state).tolist())[0]
        if action in ("clean", "fix"):
            return _call(f"print({a} * {b} + {c})")
        if action == "buggy":
            return _call("print(a * b + c)")  # NameError: the numbers never made it into the code
        if action == "malformed":
            return '<tool_call>{"name": "python", "arguments": {"code": print(' + f"{a}*{b}" + ")}}</tool_call>"
        guess = a * b + c if self.rng.random() < GUESS_CORRECT else a * b + c + self.rng.randint(1, 999)
        return f"<answer>{guess}</answer>"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        outs = []
        for p in prompts:
            ids = encode(self._turn(decode(p)))
            outs.append(Rollout(prompt_ids=list(p), token_ids=ids, logprobs=torch.zeros(len(ids)),
                                finish_reason="stop"))
        return outs

    @staticmethod
    def decisions(traj: ToolTrajectory) -> list[tuple[str, str]]:
        """(state, action) per sampled decision, recovered from the model turns' text."""
        turns = _RESPONSE.split(traj.text)[::2]  # model turns (the split interleaves response bodies)
        out, state = [], "start"
        for k, turn in enumerate(turns):
            if "<tool_call>" not in turn:
                out.append((state, "guess"))
                break
            kind = "buggy" if "a * b" in turn else "malformed" if '"code": print' in turn else (
                "clean" if state == "start" else "fix")
            out.append((state, kind))
            if k >= len(traj.results) or not traj.results[k].is_error:
                break  # a result came back: the next turn only reports it
            state = "after_error"
        return out

    def update(self, trajs: list[ToolTrajectory], advantages: list[float], lr: float) -> None:
        """REINFORCE on the table: logits[s] += lr * mean_i A_i * (onehot(a) - pi(s))."""
        grads = {s: torch.zeros_like(v) for s, v in self.logits.items()}
        for t, adv in zip(trajs, advantages):
            for state, action in self.decisions(t):
                g = -self.probs(state)
                g[ACTIONS[state].index(action)] += 1.0
                grads[state] += adv * g
        for s in self.logits:
            self.logits[s] += lr * grads[s] / max(1, len(trajs))


@functools.lru_cache(maxsize=4096)
def _cached_run(code: str, timeout_s: float, memory_mb: int) -> ToolResult:
    """Same code, same outcome: the buggy call is one string, so cache it (saves sandbox starts)."""
    return run_python(code, timeout_s, memory_mb)


def rollouts(policy: ScriptedToolPolicy, problems: list[Problem], n: int) -> list[list[ToolTrajectory]]:
    """``n`` multi-turn trajectories per problem through the real tool environment; [problem][n]."""
    prompts = [encode(p.prompt) for p in problems for _ in range(n)]
    trajs = multi_turn_rollout(policy, encode, decode, prompts, SamplingParams(max_new_tokens=256),
                               max_turns=4, timeout_s=2.0, run_tool=_cached_run)
    return [trajs[i * n:(i + 1) * n] for i in range(len(problems))]


def _error_ratio(trajs: list[ToolTrajectory], rewards: list[float]) -> float:
    """rStar2-Agent Fig. 4's y axis: erroneous tool calls / tool calls, over positive trajectories."""
    calls = sum(len(t.results) for t, r in zip(trajs, rewards) if r > 0)
    errors = sum(t.n_tool_errors for t, r in zip(trajs, rewards) if r > 0)
    return errors / calls if calls else float("nan")


def _advantages(rewards: list[float]) -> list[float]:
    r = torch.tensor(rewards, dtype=torch.float64)
    return ((r - r.mean()) / (r.std(unbiased=False) + 1e-6)).tolist()  # GRPO, docs/conventions.md


@dataclass
class RocRun:
    """``curves``: dims (arm, step) with the positives' tool-error ratio (all sampled and the
    trained subset), accuracy and the policy's buggy-call probability; ``figure``: Fig. 4."""

    curves: xr.Dataset
    figure: Figure


@quiet_when_asked
def train(steps: int = 30, prompts_per_step: int = 8, group_size: int = 8, lr: float = 2.0, seed: int = 0,
          progress: bool = True) -> RocRun:
    """GRPO (G rollouts per prompt) vs GRPO-RoC (2G sampled, ``roc_select`` keeps G), same seeds."""
    rows = []
    for arm in ("GRPO", "GRPO-RoC"):
        policy, gen = ScriptedToolPolicy(seed), torch.Generator().manual_seed(seed)
        for step in tqdm(range(steps), desc=arm, disable=not progress):
            problems = sample_problems(prompts_per_step, seed=seed * 100_003 + step)
            n = 2 * group_size if arm == "GRPO-RoC" else group_size
            sampled, kept = [], []
            for prob, group in zip(problems, rollouts(policy, problems, n)):
                rw = [reward(prob, t.text) for t in group]
                idx = (roc_select(rw, [t.p_err + t.p_format for t in group], group_size, generator=gen)
                       if arm == "GRPO-RoC" else list(range(n)))
                sampled.append((group, rw))
                kept.append(([group[i] for i in idx], [rw[i] for i in idx]))
            flat = lambda pairs: ([t for g, _ in pairs for t in g], [x for _, r in pairs for x in r])  # noqa: E731
            all_t, all_r = flat(sampled)
            kept_t, kept_r = flat(kept)
            rows.append({"arm": arm, "step": step, "error_ratio_positives": _error_ratio(all_t, all_r),
                         "error_ratio_trained": _error_ratio(kept_t, kept_r), "accuracy": float(np.mean(all_r)),
                         "p_buggy_start": float(policy.probs("start")[1] + policy.probs("start")[2])})
            policy.update(kept_t, [a for _, r in kept for a in _advantages(r)], lr)
    curves = pd.DataFrame(rows).set_index(["arm", "step"]).to_xarray()
    curves.attrs = {"steps": steps, "prompts_per_step": prompts_per_step, "group_size": group_size, "lr": lr, "seed": seed}
    return RocRun(curves, _figure(curves))


def _figure(ds: xr.Dataset) -> Figure:
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    for arm, color in (("GRPO", "#c0392b"), ("GRPO-RoC", "#2c7fb8")):
        d = ds.sel(arm=arm)
        ax1.plot(d["step"], 100 * d["error_ratio_positives"], color=color, label=f"{arm}: sampled positives")
        ax2.plot(d["step"], 100 * d["accuracy"], color=color, label=arm)
    d = ds.sel(arm="GRPO-RoC")
    ax1.plot(d["step"], 100 * d["error_ratio_trained"], color="#2c7fb8", ls="--", label="GRPO-RoC: kept positives")
    ax1.set(xlabel="training step", ylabel="% tool calls with errors",
            title="tool errors in correct trajectories (rStar2-Agent Fig. 4)")
    ax2.set(xlabel="training step", ylabel="% correct", title="answer accuracy")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    return fig


def selection_table(trajs: list[ToolTrajectory], rewards: list[float], group_size: int, seed: int = 0) -> pd.DataFrame:
    """One 2G group: which rollouts each rule keeps, with their p_err, so RoC's asymmetry is visible."""
    gen = torch.Generator().manual_seed(seed)
    kept = set(roc_select(rewards, [t.p_err + t.p_format for t in trajs], group_size, generator=gen))
    return pd.DataFrame({"reward": rewards, "tool_calls": [len(t.results) for t in trajs],
                         "tool_errors": [t.n_tool_errors for t in trajs], "p_err": [t.p_err for t in trajs],
                         "outcomes": [",".join(r.outcome for r in t.results) for t in trajs],
                         "kept_by_roc": [i in kept for i in range(len(trajs))]})
