"""Spec + checkpoint -> a running engine: the one builder of aligntools.

``mlab capture``, the alignment gate (``mlab check`` / ``check_alignment``), ``attribute`` and
the vLLM rollout plugin all build their engines here, so one spec gives the same engine (dtype,
kernels, knobs, vLLM settings) whichever of them reads it; the spec grammar and the default
dtypes are ``minirl.EngineSpec``'s. minirl's trainer builds its own minirl ``Engine`` from the
same ``EngineSpec`` (minirl never imports aligntools); a test checks both agree.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minirl import EngineSpec


def build_engine(spec: EngineSpec | str, path: str | os.PathLike, dtype: str | None = None) -> object:
    """The engine ``spec`` names on checkpoint ``path``: a transformers model (``hf``), a minirl
    ``Engine`` (knobs from preset + overrides) or an in-process, eager vLLM ``LLM`` (``vllm``).
    ``dtype``: used when the spec names none (else they must agree); unset, the kind's default
    (``EngineSpec.engine_dtype``: hf float32, vllm bfloat16, minirl by preset)."""
    from minirl import Engine, EngineSpec

    spec = EngineSpec.parse(spec) if isinstance(spec, str) else spec
    dtype = spec.engine_dtype(dtype)
    if spec.kind == "hf":
        return load_hf(path, dtype, **spec.options)
    if spec.kind == "vllm":
        from minirl.vllm.llm import create_llm

        return create_llm(path, dtype, **spec.options)
    return Engine.from_pretrained(path, dtype=dtype, knobs=spec.knobs())


def load_hf(path: str | os.PathLike, dtype: str, attn: str | None = None, experts: str | None = None):
    """The lab's training engine: a transformers model, loaded the way a trainer would.

    ``attn``/``experts`` None = transformers' own defaults (what a stock trainer runs); the
    float64 noise-floor reference always uses the eager experts loop, because grouped_mm has no
    float64 kernel (the attention kernels agree to ~1e-7 in fp32, so this changes no verdict).
    """
    import torch
    import transformers

    kwargs = {k: v for k, v in (("attn_implementation", attn), ("experts_implementation", experts)) if v}
    if dtype == "float64":
        kwargs["experts_implementation"] = "eager"
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), **kwargs).eval()
