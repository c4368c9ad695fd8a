"""Fallback for models with no recognisable decoder layers: sites are raw module paths.

Why still capture: an unknown architecture can still be compared against itself (another
dtype, another kernel) module by module. Outputs that are not per-token (``[B, S, ...]``
or ``[B*S, ...]``) cannot be laid out on token rows and are skipped with a warning. The
root module's output is the ``logits`` site (a tensor or an object with ``.logits``), so
``logprobs``/``entropy`` are derived as for any engine.
"""

from __future__ import annotations

import torch
from torch import nn

from aligntools.adapters.hf import HFAdapter
from aligntools.adapters.roles import ModelRoles
from aligntools.tracker.recorder import DERIVED, Recorder


class ModulePathAdapter(HFAdapter):
    """Raw module paths (``"blocks.0.ff"``) as sites; layout and running as in HFAdapter."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, ModelRoles(layers=[], embed=None, final_norm=None, lm_head=None), engine="module")
        self._paths = {path: mod for path, mod in model.named_modules() if path}

    def available_sites(self) -> list[str]:
        return ["logits", *DERIVED, *sorted(self._paths)]

    def attach(self, recorder: Recorder) -> None:
        self._rec = recorder
        on = self._handles.append
        on(self.model.register_forward_pre_hook(self._begin_forward, with_kwargs=True))
        on(self.model.register_forward_hook(self._end_root))
        for path in recorder.needed & set(self._paths):
            on(self._paths[path].register_forward_hook(
                lambda m, a, out, path=path: self._emit(path, out[0] if isinstance(out, (tuple, list)) else out)))

    def _end_root(self, module: nn.Module, args: tuple, output: object) -> None:
        logits = getattr(output, "logits", output)
        if isinstance(logits, torch.Tensor):
            self._emit("logits", logits)
        self._end_forward(module, args, output)

