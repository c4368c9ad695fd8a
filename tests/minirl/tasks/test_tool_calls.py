"""Multi-turn tool-call rollouts (rStar2-Agent §2.2.2) with the real sandbox and a scripted model."""

from __future__ import annotations

import json
import math
import re

import pytest

import torch

from minirl import Rollout, SamplingParams
from minirl.algorithms.roc import roc_select
from minirl.sandbox.runner import MAX_RESPONSE_CHARS, ToolResult
from minirl.tasks.python_tool import reward, sample_problems
from minirl.tasks.tool_calls import multi_turn_rollout, parse_tool_call


def encode(s: str) -> list[int]:
    return list(s.encode())


def decode(ids: list[int]) -> str:
    return bytes(ids).decode(errors="replace")


def _call(code: str) -> str:
    return '<tool_call>{"name": "python", "arguments": {"code": %s}}</tool_call>' % json.dumps(code)


class ScriptedModel:
    """Behaviour picked by a tag in the prompt; emits junk after </tool_call> to test the cut."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        out = []
        for p in prompts:
            ctx = decode(p)
            mode = re.search(r"mode=(\w+)", ctx).group(1)
            a, b, c = map(int, re.search(r"compute (\d+) \* (\d+) \+ (\d+)", ctx).groups())
            responses = re.findall(r"<tool_response>(.*?)</tool_response>", ctx.split("Problem:")[1], re.S)
            if mode == "direct":
                text = f"<answer>{a * b + c}</answer>"
            elif not responses:
                text = {"tool": _call(f"print({a} * {b} + {c})"), "bad_json": "<tool_call>{oops</tool_call>",
                        "flood": _call("print('x' * 10**6)"), "loop": _call("while True: pass")}[mode]
                text += " JUNK AFTER CALL"
            else:
                got = responses[-1].strip()
                text = f"<answer>{got if got.isdigit() else 0}</answer>"
            ids = encode(text)
            out.append(Rollout(p, ids, torch.zeros(len(ids)), "stop"))
        return out


def test_parse_tool_call() -> None:
    assert parse_tool_call("no call here") == (None, None)
    assert parse_tool_call(_call("print(1)")) == ("print(1)", None)
    code, err = parse_tool_call("<tool_call>{not json</tool_call>")
    assert code is None and "does not parse" in err
    assert parse_tool_call('<tool_call>{"name": "python"}</tool_call>')[1].startswith("Invalid tool call")


def test_multi_turn_rollout_end_to_end() -> None:
    problems = sample_problems(5, seed=0)
    modes = ["tool", "bad_json", "flood", "loop", "direct"]
    prompts = [encode(f"mode={m} " + p.prompt) for m, p in zip(modes, problems)]
    trajs = multi_turn_rollout(ScriptedModel(), encode, decode, prompts, SamplingParams(max_new_tokens=256),
                               max_turns=3, timeout_s=1.0)
    tool, bad, flood, loop, direct = trajs
    assert [reward(p, t.text) for p, t in zip(problems, trajs)] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert "JUNK" not in tool.text and tool.n_turns == 2 and tool.results[0].outcome == "stdout"
    assert (tool.p_err, tool.p_format) == (0.0, 0.0)
    assert bad.results[0].outcome == "error" and bad.p_err == 1.0  # malformed JSON = tool error
    assert "<tool_response>Invalid tool call" in bad.text
    assert len(flood.results[0].text) <= MAX_RESPONSE_CHARS + 100
    assert loop.results[0].outcome == "timeout" and loop.p_err == 1.0
    assert direct.p_err == 0.5 and direct.n_turns == 1  # Eq. 4 default without tool calls
    for t in trajs:  # tool-response tokens are context, not actions
        assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask)
        assert decode([i for i, m in zip(t.token_ids, t.loss_mask) if m == 0]).count("<tool_response>") == len(t.results)
    penalties = [t.p_err + t.p_format for t in trajs] * 2
    rewards = [reward(p, t.text) for p, t in zip(problems, trajs)] * 2
    kept = roc_select(rewards, penalties, 5, generator=torch.Generator().manual_seed(0), mode="lowest")
    assert sum(rewards[i] for i in kept) == 2 and {0, 5} & set(kept)  # the clean tool trace is kept


# One model output each that used to stop the run (issue #26): deep nesting, a 5,000-digit number,
# a tool that does not exist.
HOSTILE_CALLS = {
    "nests too deeply": "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    "does not parse": '<tool_call>{"name": "python", "arguments": {"code": "1"}, "n": ' + "9" * 5000 + "}</tool_call>",
    "unknown tool 'bash'": '<tool_call>{"name": "bash", "arguments": {"code": "print(1)"}}</tool_call>',
}


class FixedModel:
    """Prompt ``i:`` gets ``texts[i]``; once a tool has answered, a final answer."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        out = []
        for p in prompts:
            ctx = decode(p)
            ids = encode("<answer>0</answer>" if "<tool_response>" in ctx else self.texts[int(ctx.split(":")[0])])
            out.append(Rollout(p, ids, torch.zeros(len(ids)), "stop"))
        return out


def test_hostile_tool_calls_are_error_observations_never_run() -> None:
    for why, text in HOSTILE_CALLS.items():
        code, error = parse_tool_call(text)
        assert code is None and error.startswith("Invalid tool call") and why in error, (why, error)
    ran: list[str] = []

    def spy(code: str, timeout_s: float, memory_mb: int) -> ToolResult:
        ran.append(code)
        return ToolResult("stdout", "ran")
    texts = list(HOSTILE_CALLS.values())
    trajs = multi_turn_rollout(FixedModel(texts), encode, decode, [encode(f"{i}:") for i in range(len(texts))],
                               SamplingParams(max_new_tokens=8), max_turns=2, run_tool=spy)
    assert ran == []
    for why, t in zip(HOSTILE_CALLS, trajs):
        assert [r.outcome for r in t.results] == ["error"] and why in t.results[0].text and t.n_turns == 2


@pytest.mark.parametrize("kwargs, name", [({"timeout_s": math.inf}, "timeout_s"),
                                          ({"memory_mb": math.nan}, "memory_mb")])
def test_rollout_refuses_limits_that_disable_themselves(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}=.*: must be"):
        multi_turn_rollout(FixedModel(["x"]), encode, decode, [encode("0:")], SamplingParams(max_new_tokens=8),
                           **kwargs)


def test_trajectory_format_penalty_requires_a_closed_answer():
    """An unclosed <answer> is a format violation (rStar2-Agent Eq. 5), in the trajectory the
    rollout builds, not only in ``roc.answer_format_penalty``."""
    from minirl.tasks.tool_calls import ToolTrajectory

    unclosed = ToolTrajectory(prompt_ids=[1], n_turns=1, text="<answer>3")
    closed = ToolTrajectory(prompt_ids=[1], n_turns=1, text="<answer>3</answer>")
    assert (unclosed.p_format, closed.p_format) == (1.0, 0.0)
