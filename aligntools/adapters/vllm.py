"""vLLM ``LLM`` -> sites (vLLM's CPU build here, CUDA vLLM on GPU machines; vLLM is imported
only when such a target is captured).

Requirements, because hooks must live where the model runs: ``LLM(..., enforce_eager=True)``
(CUDA graphs / torch.compile replay kernels without calling module hooks) and the engine in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``collective_rpc`` hands back the
worker's model runner itself. ``minirl.vllm.llm.create_llm`` makes such an LLM.

Token layout per forward: ``input_ids``/``positions`` from the model call, request boundaries
from the forward context's ``query_start_loc``, request identity from the runner's persistent
batch (``input_batch.req_ids``, stable across decode steps), and the step from the position
relative to the request's prompt length. Module conventions: see fused.py. Two things are not
module outputs in vLLM, so they are read by wrapping methods while attached:
  * routing: the MoE runner calls ``router.select_experts(hidden_states, router_logits) ->
    (topk_weights, topk_ids)`` (the gate's ``GateLinear`` is not called as a module); its
    arguments and result are vLLM's own routing, nothing is recomputed (``minirl.vllm.routing``'s
    ``hook_select_experts`` and ``forward_layout``, shared with the R3 routing recorder);
  * logits: the runner calls ``model.compute_logits(h)`` with ``h = hidden[logits_indices]``
    (a copy: each request's last token) for sampling and, for requests asking for prompt
    logprobs, once per request with ``h = hidden[offset:offset + n]`` (a *view*: every other
    prompt position). A view's offset into the model's output gives its rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from aligntools.adapters.fused import FusedModuleAdapter, Rows, first, flat_meta
from minirl.vllm.routing import forward_layout, hook_select_experts, model_runner
from aligntools.sites import sort_sites
from aligntools.tracker.recorder import DERIVED

ROUTING = ("router_logits", "topk_ids", "topk_weights")


@dataclass(frozen=True)
class MethodTap:
    """A method wrapped while attached: ``owner.name`` (``path`` for the module map)."""

    path: str
    owner: object
    name: str
    kinds: tuple[str, ...]
    layer: int | None


class VllmAdapter(FusedModuleAdapter):
    engine = "vllm"

    def __init__(self, llm: object) -> None:
        runner = model_runner(llm)
        if not runner.model_config.enforce_eager:
            raise ValueError("vLLM LLM created without enforce_eager=True: compiled graphs skip module hooks; "
                             "create it with LLM(..., enforce_eager=True)")
        self.llm, self.runner = llm, runner
        self._request_index: dict[str, int] = {}
        self._hidden: torch.Tensor | None = None
        self._patched: list[tuple[object, str]] = []
        super().__init__(runner.model, runner.model_config.hf_config)
        self.taps = self._method_taps()
        tapped = {k for t in self.taps for k in t.kinds}
        self.plan = [p for p in self.plan if not set(p.kinds) & tapped]  # routing/logits come from the taps

    def _method_taps(self) -> list[MethodTap]:
        paths = {id(m): p for p, m in self.model.named_modules()}
        taps = [MethodTap("compute_logits", self.model, "compute_logits", ("logits",), None)]
        for lr in self.roles.layers:
            runner = _moe_runner(lr.mlp)
            if runner is not None:
                taps.append(MethodTap(f"{paths[id(runner)]}.router.select_experts", runner.router, "select_experts",
                                      ROUTING, lr.index))
        return taps

    def available_sites(self) -> list[str]:
        tapped = [k if t.layer is None else f"L{t.layer}.{k}" for t in self.taps for k in t.kinds]
        return sort_sites(list(set(super().available_sites()) | set(tapped) | set(DERIVED)))

    def attach(self, recorder) -> None:
        super().attach(recorder)
        self._handles.append(self.model.register_forward_hook(self._keep_hidden))
        need = recorder.needed
        for tap in self.taps:
            names = {k: k if tap.layer is None else f"L{tap.layer}.{k}" for k in tap.kinds}
            if not need & set(names.values()):
                continue
            if tap.name == "compute_logits":
                setattr(tap.owner, tap.name, self._logits_tap(getattr(tap.owner, tap.name), names))
            else:
                hook_select_experts(tap.owner, functools.partial(self._on_route, names))
            self._patched.append((tap.owner, tap.name))  # an instance attribute shadows the method; detach deletes it

    def detach(self) -> None:
        for owner, name in self._patched:
            owner.__dict__.pop(name, None)
        self._patched.clear()
        self._hidden = None
        super().detach()

    def _keep_hidden(self, module: nn.Module, args: tuple, output: object) -> None:
        self._hidden = first(output)  # [T, H]: what compute_logits' views point into

    def _on_route(self, names: dict[str, str], logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> None:
        """vLLM's routing of one MoE layer (``hook_select_experts``): logits [T, E], top-k [T, k]."""
        if self._rows is not None:
            self._emit(self._recorder, self._recorder.needed, names,
                       {"router_logits": logits, "topk_ids": ids, "topk_weights": weights})

    def _logits_tap(self, original, names: dict[str, str]):
        @functools.wraps(original)
        def compute_logits(hidden, *args, **kwargs):
            logits = original(hidden, *args, **kwargs)  # [n, vocab]
            if self._rows is not None and logits is not None:
                self.emit_rows("logits", logits, self._logit_rows(hidden))
            return logits
        return compute_logits

    def _logit_rows(self, hidden: torch.Tensor) -> list[Rows]:
        """Rows of ``hidden`` [n, H]: a view into the model output (prompt logprobs) sits at its
        offset; a copy with one row per request holds each request's last token."""
        base = self._hidden
        if (base is not None and hidden.dim() == 2 and hidden.untyped_storage().data_ptr()
                == base.untyped_storage().data_ptr()):
            start = (hidden.storage_offset() - base.storage_offset()) // base.stride(0)
            return self.rows_at(torch.arange(start, start + len(hidden)))
        return self._last_rows(len(hidden))

    def _layout(self, args: tuple, kwargs: dict) -> list[Rows]:
        layout = forward_layout(self.runner, args, kwargs)
        requests, steps = [], []
        for i, rid in enumerate(layout.req_ids):
            requests.append(self._request_index.setdefault(rid, len(self._request_index)))
            first_pos = int(layout.positions[int(layout.starts[i])])
            steps.append(max(0, first_pos - int(self.runner.input_batch.num_prompt_tokens[i]) + 1))
        return flat_meta(layout.input_ids, layout.positions, layout.starts, requests, steps)

    def run(self, input_ids: torch.Tensor) -> None:
        """Prefill every row once; prompt logprobs make vLLM compute logits at every position."""
        from vllm import SamplingParams

        limit = self.runner.model_config.max_model_len
        if input_ids.shape[1] + 1 > limit:  # the sampled token must fit too
            raise ValueError(f"sequence of {input_ids.shape[1]} tokens does not fit vLLM's max_model_len={limit} "
                             f"(prompt + 1 sampled token); shorten it or create the LLM with a larger max_model_len")
        prompts = [{"prompt_token_ids": row} for row in input_ids.tolist()]
        self.llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)

    def describe(self) -> dict:
        from minirl.vllm.llm import engine_settings

        info = super().describe()
        info["knobs"] = engine_settings(self.llm)
        info["model_path"] = self.runner.model_config.model
        return info


def _moe_runner(mlp: nn.Module | None) -> nn.Module | None:
    """vLLM's MoE runner inside an MLP block: the module whose ``router`` selects experts."""
    if mlp is None:
        return None
    for module in mlp.modules():
        if hasattr(getattr(module, "router", None), "select_experts"):
            return module
    return None
