"""Multi-turn tool-call rollouts (rStar2-Agent §2.2.2) with the real sandbox and a scripted model."""

from __future__ import annotations

import json
import re

import torch

from minirl import Rollout, SamplingParams
from minirl.roc import roc_select
from minirl.sandbox import MAX_RESPONSE_CHARS
from minirl.tool_task import reward, sample_problems
from minirl.tools import multi_turn_rollout, parse_tool_call


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
