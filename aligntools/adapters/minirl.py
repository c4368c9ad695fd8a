"""minirl ``Engine`` -> sites, through the engine's explicit taps (minirl/engine/tap.py).

The engine already emits every site un-fused and flat over tokens with its own TapMeta,
so this adapter only forwards what the capture needs. What it adds is call boundaries:
``score`` and ``generate`` are wrapped on the engine instance while attached, so each call
starts new request indices (two calls under one Tracker never collide on a row).
Only the public engine surface is used (``add_tap``, ``score``, ``generate``, ``knobs``,
``dtype``, ``n_layers``, ``moe_layers``, ``config``).
"""

from __future__ import annotations

import functools

import torch

from aligntools.adapters.base import Adapter
from aligntools.tracker.provenance import model_hash
from aligntools.tracker.recorder import Recorder
from aligntools.sites import all_sites

_CALLS = ("score", "generate")


class MinirlAdapter(Adapter):
    engine = "minirl"

    def __init__(self, engine: object) -> None:
        self.target = engine
        self._handle = None
        self._wrapped: list[str] = []

    def available_sites(self) -> list[str]:
        return all_sites(self.target.n_layers, set(self.target.moe_layers))

    def attach(self, recorder: Recorder) -> None:
        need = recorder.needed

        def tap(site: str, value: torch.Tensor, meta: object) -> None:
            if site in need:
                recorder.emit(site, value, meta)

        self._handle = self.target.add_tap(tap)
        for name in _CALLS:
            original = getattr(self.target, name)

            @functools.wraps(original)
            def call(*args, _original=original, **kwargs):
                recorder.begin_call()
                out = _original(*args, **kwargs)
                recorder.end_forward()  # its last forward's values, if they were left on a device
                return out

            setattr(self.target, name, call)
            self._wrapped.append(name)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        for name in self._wrapped:
            delattr(self.target, name)  # the instance attribute shadowed the class method
        self._wrapped.clear()

    def run(self, input_ids: torch.Tensor) -> None:
        self.target.score(input_ids.tolist())

    def vocab_size(self) -> int | None:
        return getattr(getattr(self.target, "spec", None), "vocab_size", None)

    def describe(self) -> dict:
        eng = self.target
        model = getattr(eng, "model", None)
        return {"dtype": str(eng.dtype).removeprefix("torch."), "knobs": eng.knobs.to_dict(),
                "model_hash": model_hash(model if isinstance(model, torch.nn.Module) else None,
                                         getattr(eng, "path", None)),
                "model_path": getattr(eng, "path", None), "unquantized": getattr(eng, "unquantized", {})}
