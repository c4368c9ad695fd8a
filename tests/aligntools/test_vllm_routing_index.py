"""The routing recorder's request index (CPU, no vLLM): recorded forwards are found by the
request id without vLLM's random suffix, and by a whole id that never had one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minirl.vllm.routing import RoutingRecorder, _Step


class _Router:
    def select_experts(self, *args, **kwargs):  # what the recorder looks for
        raise NotImplementedError


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = _Router()


class _Runner:
    model = nn.Sequential(_Layer())


class _LLM:
    def collective_rpc(self, fn):
        return [fn(type("Worker", (), {"model_runner": _Runner()})())]


def _step(req_ids: list[str], positions: list[int], tokens: list[int], experts: list[list[int]]) -> _Step:
    starts = list(range(0, len(positions) + 1, len(positions) // len(req_ids)))
    return _Step(req_ids, starts, torch.tensor(positions), torch.tensor(tokens), [torch.tensor(experts)])


@pytest.mark.parametrize("internal, asked", [("0-a1b2c3", "0"), ("req-7", "req-7"), ("1_0-ffee", "1_0")])
def test_recorded_rows_are_found_by_prefix_or_whole_id(internal, asked):
    rec = RoutingRecorder(_LLM())
    rec.steps.append(_step([internal, "other-9"], [0, 1, 0, 1], [5, 6, 8, 9], [[1, 2], [3, 4], [0, 0], [0, 0]]))
    rec.steps.append(_step([internal], [2], [7], [[5, 6]]))  # a decode step
    got = rec.routed_experts(asked, [5, 6, 7, 11])  # [4, 1 layer, k=2]: the last token repeats
    assert got[:, 0].tolist() == [[1, 2], [3, 4], [5, 6], [5, 6]]


def test_a_request_never_recorded_names_the_missing_positions():
    rec = RoutingRecorder(_LLM())
    rec.steps.append(_step(["0-a1"], [0, 1], [5, 6], [[1, 2], [3, 4]]))
    with pytest.raises(RuntimeError, match="1"):
        rec.routed_experts("1", [5, 6, 7])
