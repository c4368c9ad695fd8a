"""SGLang model runner -> sites (GPU machines; SGLang is imported only for such a target).

The target is an in-process ``ModelRunner`` (what SGLang's ``bench_one_batch`` drives; the
HTTP server runs the model in another process, out of reach of hooks). Each
``runner.forward(forward_batch)`` gives the token layout: ``input_ids``/``positions`` flat,
``extend_seq_lens`` per request in prefill (one token each in decode), requests identified
by their ``req_pool_indices`` slot. Module conventions are vLLM's (see fused.py).
"""

from __future__ import annotations

import functools

import torch

from aligntools.adapters.fused import FusedModuleAdapter, Rows, flat_meta


class SglangAdapter(FusedModuleAdapter):
    engine = "sglang"

    def __init__(self, runner: object) -> None:
        self.runner = runner
        self._batch = None
        self._steps: dict[int, int] = {}  # pool slot -> decode step of the request in it
        self._request: dict[int, int] = {}  # pool slot -> capture request id (slots are reused)
        self._next_request = 0
        super().__init__(runner.model, runner.model_config.hf_config)

    def attach(self, recorder) -> None:
        original = self.runner.forward

        @functools.wraps(original)
        def forward(forward_batch, *args, **kwargs):
            self._batch = forward_batch
            return original(forward_batch, *args, **kwargs)

        self.runner.forward = forward
        super().attach(recorder)

    def detach(self) -> None:
        self.runner.__dict__.pop("forward", None)
        super().detach()

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
        raise NotImplementedError("drive the SGLang ModelRunner yourself (e.g. its bench_one_batch "
                                  "prefill) under the Tracker; aligntools does not build ForwardBatches")
