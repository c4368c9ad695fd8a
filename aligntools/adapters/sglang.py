"""SGLang model runner -> sites (SGLang's CPU path here, CUDA SGLang on GPU machines; SGLang is
imported only when such a target is captured).

The target is an in-process ``ModelRunner`` (what SGLang's one-batch benchmark drives; the HTTP
server and ``sglang.Engine`` run the model in another process, out of reach of hooks), or
``minirl.sglang.runner.SglangRunner``, which makes one and can ``run`` prompts itself. Each
``runner.forward(forward_batch)`` gives the token layout: ``input_ids``/``positions`` flat,
``extend_seq_lens`` per request in prefill (one token each in decode), requests identified by
their ``req_pool_indices`` slot. ``ModelRunner`` calls ``model.forward`` directly (no module
hook fires on the model itself), so each forward's layout is taken in a wrapper of
``runner.forward``. Module conventions are vLLM's (fused.py), except for three sites:
  * ``resid_post``: a decoder layer returns only its MLP output; the residual travels in SGLang's
    layer communicator and is added by the next fused ``RMSNorm(x, residual) -> (normed, x +
    residual)``. So layer i's ``resid_post`` is the residual output of layer i+1's
    ``input_layernorm``, and the last layer's is that of the final norm;
  * routing: SGLang's ``TopK`` module (``mlp.topk``) is called with the gate's logits and returns
    its own choice ``(topk_weights, topk_ids, router_logits)``: that is recorded, nothing is
    recomputed;
  * logits: ``LogitsProcessor.forward`` returns only the sampled rows; the rows it computes come
    from its ``_get_logits(hidden, lm_head, meta)``, called once with every prompt position when
    the requests ask for input logprobs from position 0 (``SglangRunner.run`` does) and with each
    request's last token otherwise. That method is wrapped while attached.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from aligntools.adapters.fused import FusedModuleAdapter, HookPlan, Rows, flat_meta, norm_outputs
from aligntools.sites import sort_sites
from aligntools.tracker.recorder import DERIVED

ROUTING = ("router_logits", "topk_ids", "topk_weights")


def model_runner(target: object) -> object:
    """SGLang's ``ModelRunner`` of a capture target (a runner, or minirl's ``SglangRunner``)."""
    return getattr(target, "model_runner", target)


class SglangAdapter(FusedModuleAdapter):
    engine = "sglang"

    def __init__(self, target: object) -> None:
        self.target, self.runner = target, model_runner(target)
        self._batch = None
        self._steps: dict[int, int] = {}  # pool slot -> decode step of the request in it
        self._request: dict[int, int] = {}  # pool slot -> capture request id (slots are reused)
        self._next_request = 0
        self._patched: list[tuple[object, str]] = []
        super().__init__(self.runner.model, self.runner.model_config.hf_config)
        self._begun = None  # the forward batch whose layout is taken
        self.plan = [p for p in self.plan if not set(p.kinds) & {*ROUTING, "logits", "resid_post"}] + self._topk_plan()
        layers = self.roles.layers
        # (norm module, layer whose resid_post is that norm's residual output)
        self.residual_taps = [(nxt.attn_norm, lr.index) for lr, nxt in zip(layers[:-1], layers[1:])]
        self.residual_taps.append((self.roles.final_norm, layers[-1].index))

    def _topk_plan(self) -> list[HookPlan]:
        paths = {id(m): p for p, m in self.model.named_modules()}
        plan = []
        for lr in self.roles.layers:
            topk = getattr(lr.mlp, "topk", None)
            if isinstance(topk, nn.Module):
                plan.append(HookPlan(paths[id(topk)], topk, lambda a, o: dict(zip(ROUTING, (o[2], o[1], o[0]))),
                                     ROUTING, lr.index))
        return plan

    def available_sites(self) -> list[str]:
        resid = {f"L{i}.resid_post" for _, i in self.residual_taps}
        return sort_sites(list(set(super().available_sites()) | resid | {"logits", *DERIVED}))

    def attach(self, recorder) -> None:
        original = self.runner.forward

        @functools.wraps(original)
        def forward(forward_batch, *args, **kwargs):
            self._batch = forward_batch
            self._begin(self.model, (), {})
            return original(forward_batch, *args, **kwargs)

        self.runner.forward = forward
        self._patched.append((self.runner, "forward"))
        super().attach(recorder)
        for norm, layer in self.residual_taps:
            name = {"resid_post": f"L{layer}.resid_post"}
            if name["resid_post"] in recorder.needed:
                self._handles.append(norm.register_forward_hook(
                    lambda m, a, o, name=name: self._emit(recorder, recorder.needed, name,
                                                          {"resid_post": norm_outputs(o)[1]})))
        if "logits" in recorder.needed:
            processor = self.model.logits_processor
            processor._get_logits = self._logits_tap(processor._get_logits)
            self._patched.append((processor, "_get_logits"))

    def detach(self) -> None:
        for owner, name in self._patched:  # an instance attribute shadows the method; deleting restores it
            owner.__dict__.pop(name, None)
        self._patched.clear()
        self._batch = self._begun = None
        super().detach()

    def _begin(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._batch is not self._begun:  # once per forward, whichever of the wrapper or a model hook runs
            self._begun = self._batch
            super()._begin(module, args, kwargs)

    def _logits_tap(self, original):
        @functools.wraps(original)
        def get_logits(hidden, *args, **kwargs):
            logits = original(hidden, *args, **kwargs)  # [n, vocab]: every row, or each request's last
            if self._rows is not None:
                self._emit(self._recorder, self._recorder.needed, {"logits": "logits"}, {"logits": logits})
            return logits
        return get_logits

    def _layout(self, args: tuple, kwargs: dict) -> list[Rows]:
        fb = self._batch
        slots = fb.req_pool_indices.tolist()
        if fb.forward_mode.is_decode():
            lens = [1] * len(slots)
            for s in slots:
                self._steps[s] = self._steps.get(s, 0) + 1
        else:  # a prefill starts a new request, even in a slot an earlier request used
            lens = fb.extend_seq_lens.tolist()
            self._steps.update({s: 0 for s in slots})
            for s in slots:
                self._request[s], self._next_request = self._next_request, self._next_request + 1
        qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
        return flat_meta(fb.input_ids, fb.positions, qsl, [self._request[s] for s in slots],
                         [self._steps[s] for s in slots])

    def run(self, input_ids: torch.Tensor) -> None:
        """Prefill every row once, with input logprobs from position 0 so that SGLang computes
        logits at every prompt position (needs minirl's ``SglangRunner``, which builds batches)."""
        if not hasattr(self.target, "prefill"):
            raise TypeError("aligntools.capture(model_runner, ids) needs minirl.sglang.runner.SglangRunner to build "
                            "SGLang's batches; capture a bare ModelRunner by driving it yourself under the Tracker")
        try:
            self.target.prefill(self.target.requests(input_ids.tolist()))
        finally:
            self.target.clear()

    def describe(self) -> dict:
        info = super().describe()
        settings = getattr(self.target, "settings", None)
        info["knobs"] = settings() if callable(settings) else {}
        info["model_path"] = self.runner.model_config.model_path
        return info
