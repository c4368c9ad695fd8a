"""vLLM's own expert choices during ``generate``, per request and position: what R3 router replay
needs from a vLLM rollout engine on CPU, where vLLM's ``enable_return_routed_experts`` (GPU model
runner only) is unavailable.

How: vLLM's MoE runner calls ``router.select_experts(hidden, router_logits) -> (topk_weights,
topk_ids)``; ``hook_select_experts`` wraps it and hands vLLM's own routing to a callback, nothing
recomputed. ``forward_layout`` reads each step's token layout: ``positions`` / ``input_ids``
from the model call, request boundaries from the forward context's ``query_start_loc``, request
identity from the runner's ``input_batch.req_ids``. Both are the one copy of these taps: the
capture adapter (``vllm.py``) uses them too.

vLLM names a request ``{external id}-{8 random chars}`` and, with ``n > 1``, its samples
``{index}_{external id}-{8 random chars}``; ``RoutingRecorder.request_for`` inverts that naming and
``routed_experts`` then checks every recorded token against the sequence, so a change of that
convention fails loudly instead of replaying another request's experts.

The final sampled token is never fed to the model (generation stops), so vLLM routes positions
``0 .. len-2`` only. Its row repeats row ``len-2``: under causal attention the final position
influences no logprob the trainer computes (it predicts the token after the sequence), so the
choice changes nothing (tested); minirl's engine feeds the final token once more instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn


def model_runner(llm: object) -> object:
    """vLLM's model runner of an in-process ``LLM``, where the model and its hooks live."""
    runner = llm.collective_rpc(lambda worker: worker.model_runner)[0]
    if not hasattr(runner, "model"):
        raise RuntimeError("cannot reach vLLM's model runner from this process: create the LLM with "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 and enforce_eager=True "
                           "(minirl.vllm.llm.create_llm does)")
    return runner


@dataclass(frozen=True)
class Layout:
    """One vLLM forward's tokens: ``input_ids`` / ``positions`` [T]; request ``req_ids[i]`` owns
    rows ``starts[i]:starts[i+1]`` (``starts`` [n_req + 1] int64 on CPU)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    starts: torch.Tensor
    req_ids: list[str]


def forward_layout(runner: object, args: tuple, kwargs: dict) -> Layout:
    """The token layout of the forward about to run (call from a forward pre-hook on the model):
    ids and positions from the model call, boundaries from the forward context's
    ``query_start_loc``, identity from the runner's persistent batch (stable across steps)."""
    from vllm.forward_context import get_forward_context

    input_ids = kwargs.get("input_ids", args[0] if args else None)
    positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
    meta = get_forward_context().attn_metadata
    meta = next(iter(meta.values())) if isinstance(meta, dict) else meta
    n_req = runner.input_batch.num_reqs
    starts = meta.query_start_loc[: n_req + 1].cpu()
    n_tok = int(starts[-1])  # eager mode pads nothing, but slice to be safe
    return Layout(input_ids[:n_tok], positions[:n_tok], starts, list(runner.input_batch.req_ids[:n_req]))


def hook_select_experts(router: object, on_route: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> None:
    """Wrap ``router.select_experts`` so each call, after vLLM's own routing, hands
    ``on_route(router_logits [T, E], topk_weights [T, k], topk_ids [T, k])`` vLLM's result
    (nothing recomputed). An instance attribute shadows the method; ``unhook_select_experts``
    removes it."""
    original = router.select_experts

    @functools.wraps(original)
    def select_experts(*args, **kwargs):
        weights, ids = original(*args, **kwargs)  # [T, k], [T, k]
        on_route(kwargs["router_logits"] if "router_logits" in kwargs else args[1], weights, ids)
        return weights, ids

    router.select_experts = select_experts


def unhook_select_experts(router: object) -> None:
    """Back to vLLM's own ``select_experts`` (a no-op when not hooked)."""
    router.__dict__.pop("select_experts", None)


@dataclass
class _Step:
    """One forward: request ``req_ids[i]`` owns rows ``starts[i]:starts[i+1]``."""

    req_ids: list[str]
    starts: list[int]
    positions: torch.Tensor  # [T] int64
    tokens: torch.Tensor  # [T] int64
    experts: list[torch.Tensor] = field(default_factory=list)  # per MoE layer, [T, k] int64


class RoutingRecorder:
    """``with RoutingRecorder(llm) as rec: llm.generate(...)``, then
    ``rec.routed_experts(rec.request_for(out.request_id, sample.index, n), sequence)``."""

    def __init__(self, llm: object) -> None:
        runner = model_runner(llm)
        self.runner = runner
        self.routers = [m.router for m in runner.model.modules()
                        if hasattr(getattr(m, "router", None), "select_experts")]  # layer order
        self.steps: list[_Step] = []
        self._index: dict[str, list[tuple[_Step, int]]] | None = None
        self._handle = None

    @property
    def is_moe(self) -> bool:
        return bool(self.routers)

    def __enter__(self) -> "RoutingRecorder":
        self.steps.clear()
        self._index = None
        self._handle = self.runner.model.register_forward_pre_hook(self._layout, with_kwargs=True)
        for layer, router in enumerate(self.routers):
            hook_select_experts(router, functools.partial(self._record, layer))
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()
        for router in self.routers:
            unhook_select_experts(router)

    def _layout(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        layout = forward_layout(self.runner, args, kwargs)
        self.steps.append(_Step(layout.req_ids, layout.starts.tolist(), _copy(layout.positions),
                                _copy(layout.input_ids)))

    def _record(self, layer: int, logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> None:
        step = self.steps[-1]
        if len(step.experts) != layer:
            raise RuntimeError(f"vLLM called MoE layer {layer} out of order (after {len(step.experts)} layers); "
                               f"the routing recorder assumes one call per layer per forward")
        step.experts.append(_copy(ids[: len(step.tokens)]))

    @staticmethod
    def request_for(request_id: str, index: int, n: int) -> str:
        """The engine-internal id of sample ``index`` of output ``request_id`` (an ``n``-sample request)."""
        return request_id if n == 1 else f"{index}_{request_id}"

    def routed_experts(self, request: str, sequence: list[int]) -> torch.Tensor:
        """[len(sequence), n_moe_layers, k] int64 for internal request id ``request`` (matched on
        its prefix before vLLM's random suffix), checked token by token against ``sequence``."""
        rows: dict[int, torch.Tensor] = {}
        tokens: dict[int, int] = {}
        for step, i in self._slices().get(request, []):
            a, b = step.starts[i], step.starts[i + 1]
            ids = torch.stack([e[a:b] for e in step.experts], dim=1)  # [b-a, n_layers, k]
            for j, pos in enumerate(step.positions[a:b].tolist()):
                rows[pos] = ids[j]  # a recomputed (preempted) position keeps its latest routing
                tokens[pos] = int(step.tokens[a + j])
        want = range(len(sequence) - 1)
        missing = [p for p in want if p not in rows]
        if missing:
            raise RuntimeError(f"vLLM request {request!r}: no routing recorded at {len(missing)} of {len(want)} "
                               f"positions (first {missing[0]}); was prefix caching on? R3 needs it off")
        wrong = [p for p in want if tokens[p] != sequence[p]]
        if wrong:
            raise RuntimeError(f"vLLM request {request!r}: recorded token at position {wrong[0]} is {tokens[wrong[0]]}, "
                               f"the sequence has {sequence[wrong[0]]}; the request-id mapping does not hold")
        out = torch.stack([rows[p] for p in want])  # [len-1, n_layers, k]
        return torch.cat([out, out[-1:]])  # the final token is never fed: repeat (see module docstring)

    def _slices(self) -> dict[str, list[tuple[_Step, int]]]:
        """Request id, with and without vLLM's random suffix -> its (forward, row block) in
        forward order; built once per recording, so looking up every sample of a batch stays
        linear."""
        if self._index is None:
            self._index = {}
            n_layers = len(self.routers)
            for step in self.steps:
                if len(step.experts) != n_layers:
                    raise RuntimeError(f"a vLLM forward routed {len(step.experts)} of {n_layers} MoE layers")
                for i, rid in enumerate(step.req_ids):
                    for key in {rid.rsplit("-", 1)[0], rid}:  # an id that has no suffix matches whole
                        self._index.setdefault(key, []).append((step, i))
        return self._index


def _copy(t: torch.Tensor) -> torch.Tensor:
    """An int64 CPU copy: vLLM reuses its ``positions`` / ``input_ids`` buffers every step, and on
    CPU ``.cpu()`` returns the same storage."""
    return t.detach().to("cpu", torch.long, copy=True)
