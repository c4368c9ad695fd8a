"""Engine adapters: pick the one that knows a capture target.

Nothing here imports nnsight, minirl, vllm or sglang at import time: the minirl engine and
nnsight models are recognised by what they have (``add_tap``, an envoy's ``_module``), vLLM
and SGLang objects by the module their type comes from.
"""

from __future__ import annotations

import warnings

from torch import nn

from aligntools.adapters.base import Adapter


def adapter_for(target: object) -> Adapter:
    """The adapter for a transformers model, a minirl Engine, an nnsight model, a vLLM
    ``LLM``, an SGLang model runner (or minirl's ``SglangRunner`` around one), an ``Adapter`` instance (used as is) or any ``nn.Module``
    (raw module paths, with a warning)."""
    if isinstance(target, Adapter):  # a custom engine brings its own adapter
        return target
    kind = type(target).__module__.split(".")[0]
    if kind == "nnsight":
        return adapter_for(target._module)
    if hasattr(target, "add_tap") and hasattr(target, "score"):
        from aligntools.adapters.minirl import MinirlAdapter

        return MinirlAdapter(target)
    if kind == "vllm":
        from aligntools.adapters.vllm import VllmAdapter

        return VllmAdapter(target)
    if kind == "sglang" or type(getattr(target, "model_runner", None)).__module__.split(".")[0] == "sglang":
        from aligntools.adapters.sglang import SglangAdapter

        return SglangAdapter(target)
    if isinstance(target, nn.Module):
        return module_adapter(target)
    raise TypeError(f"cannot capture a {type(target).__qualname__}: expected a transformers model, "
                    f"a minirl Engine, an nnsight model, a vLLM LLM or a torch.nn.Module")


def module_adapter(model: nn.Module) -> Adapter:
    """Role-mapped sites when the module has decoder layers, else raw module paths."""
    from aligntools.adapters.hf import HFAdapter
    from aligntools.adapters.module_paths import ModulePathAdapter
    from aligntools.adapters.roles import find_roles

    roles = find_roles(model, getattr(model, "config", None))
    if roles is None:
        warnings.warn(f"{type(model).__qualname__} has no recognisable decoder layers (a ModuleList of "
                      f"blocks with q/k/v/o projections); capturing raw module paths instead of sites",
                      stacklevel=3)
        return ModulePathAdapter(model)
    is_hf = type(model).__module__.startswith("transformers.")
    return HFAdapter(model, roles, engine="hf" if is_hf else "module")
