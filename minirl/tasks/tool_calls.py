"""Multi-turn tool-call rollouts in rStar2-Agent's format (§2.2.2).

The model writes ``<tool_call>{"name": ..., "arguments": {"code": ...}}</tool_call>``; at the end
of its turn we parse the JSON, run ``arguments.code`` in the sandbox and append
``<tool_response>...</tool_response>`` to the context, then let it continue, up to ``max_turns``.
A call that does not parse is answered with the parse error inside ``<tool_response>`` and counts
as a tool error (§2.2.2: "the error message is wrapped in <tool_response></tool_response> tags").

Engines know nothing of strings: each turn generates ``max_new_tokens`` and is cut *post hoc*
right after the first ``</tool_call>`` (the smallest token prefix whose decode contains it), so
this works with any engine exposing ``generate(prompts, params) -> list[Rollout]``. Tokens past
the cut are discarded (and not trained on).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from minirl.engine.sampling import SamplingParams
from minirl.algorithms.roc import answer_format_penalty, tool_error_ratio
from minirl.sandbox.runner import ToolResult, check_limits, run_python, truncate

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_NAME = "python"  # the one tool; any other name is answered with an error, never run
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_tool_call(turn_text: str) -> tuple[str | None, str | None]:
    """The first tool call of a turn -> (code, None), (None, error message), or (None, None)
    when the turn makes no call. Never raises: whatever the model wrote, the error is its
    observation (one bad output must not stop the RL run)."""
    m = _CALL.search(turn_text)
    if m is None:
        return None, None
    try:
        call = json.loads(m.group(1))
    except RecursionError:
        return None, "Invalid tool call: the JSON inside <tool_call> nests too deeply to parse"
    except ValueError as e:  # JSONDecodeError, or an integer longer than int() converts
        return None, f"Invalid tool call: the JSON inside <tool_call> does not parse ({e})"
    arguments = call.get("arguments") if isinstance(call, dict) else None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str):
        return None, f'Invalid tool call: expected {{"name": "{TOOL_NAME}", "arguments": {{"code": "<python>"}}}}'
    if call.get("name") != TOOL_NAME:
        return None, f"Invalid tool call: unknown tool {call.get('name')!r}; the only tool is {TOOL_NAME!r}"
    return code, None


def tool_response(result: ToolResult) -> str:
    return f"<tool_response>{result.text}</tool_response>"


@dataclass
class ToolTrajectory:
    """One multi-turn rollout. ``loss_mask[i]`` is 1 for model tokens, 0 for tool-response tokens
    (the environment's words are context, not actions); their logprobs are 0."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    n_turns: int = 0
    text: str = ""  # decoded model turns + tool responses
    done: bool = False

    @property
    def n_tool_errors(self) -> int:
        return sum(r.is_error for r in self.results)

    @property
    def p_err(self) -> float:
        """rStar2-Agent Eq. 4 (0.5 with no tool calls)."""
        return tool_error_ratio(len(self.results), self.n_tool_errors)

    @property
    def p_format(self) -> float:
        """rStar2-Agent Eq. 5 over the model's closed, matched <answer> blocks."""
        return answer_format_penalty(self.text, max(1, self.n_turns))


def multi_turn_rollout(engine: Any, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                       prompts: list[list[int]], params: SamplingParams, *, max_turns: int = 4,
                       timeout_s: float = 5.0, memory_mb: int = 256, workers: int = 4,
                       run_tool: Callable[..., ToolResult] = run_python) -> list[ToolTrajectory]:
    """Generate, run tools, append responses, continue; every live trajectory advances in one
    batched ``generate`` per turn and its tool calls run in parallel (``workers`` sandboxes)."""
    if max_turns < 1:
        raise ValueError(f"max_turns={max_turns}: need at least one model turn")
    check_limits(timeout_s, memory_mb)
    trajs = [ToolTrajectory(list(p)) for p in prompts]
    turn_params = dataclasses.replace(params, n=1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in range(max_turns):
            live = [t for t in trajs if not t.done]
            if not live:
                break
            outs = engine.generate([t.prompt_ids + t.token_ids for t in live], turn_params)
            calls = []
            for t, r in zip(live, outs):
                keep = _cut_after_call(r.token_ids, decode)
                t.token_ids += r.token_ids[:keep]
                t.logprobs += [float(x) for x in r.logprobs[:keep]]
                t.loss_mask += [1] * keep
                t.n_turns += 1
                turn_text = decode(r.token_ids[:keep])
                t.text += turn_text
                code, error = parse_tool_call(turn_text)
                if code is None and error is None:
                    t.done = True  # no call: the model has answered
                else:
                    calls.append((t, pool.submit(run_tool, code, timeout_s, memory_mb) if code is not None
                                  else ToolResult("error", truncate(error))))
            for t, fut in calls:
                result = fut if isinstance(fut, ToolResult) else fut.result()
                response = tool_response(result)
                ids = encode(response)
                t.results.append(result)
                t.token_ids += ids
                t.logprobs += [0.0] * len(ids)
                t.loss_mask += [0] * len(ids)
                t.text += response
    return trajs


def _cut_after_call(token_ids: list[int], decode: Callable[[list[int]], str]) -> int:
    """Smallest prefix length whose text contains </tool_call>; all tokens when there is none."""
    if CALL_CLOSE not in decode(token_ids):
        return len(token_ids)
    lo, hi = 1, len(token_ids)  # containment is monotone in the prefix length: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if CALL_CLOSE in decode(token_ids[:mid]) else (mid + 1, hi)
    return lo
