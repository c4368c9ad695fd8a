"""Engine specs on the command line: ``hf``, ``hf:bfloat16``, ``minirl:aligned,rmsnorm=fused_add``.

One grammar for every CLI that names an engine (``mlab capture``, ``mlab check``):
``NAME[:PRESET][,option=value...]`` (the first item after ``:`` may itself be an option). For
``hf`` the preset is a dtype and the options choose transformers' kernels (``attn=eager|sdpa``,
``experts=eager|grouped_mm|batched_mm``; unset = what ``from_pretrained`` picks, sdpa and
grouped_mm on CPU in transformers 5.23); for ``minirl`` the preset is a Knobs preset
(``typical``, ``aligned`` or ``hf_exact``) and the options are Knobs fields, converted from text
with the field's type (``Knobs.parse_value``); for ``vllm`` the preset is a dtype and the options
are ``aligntools.adapters.vllm_engine.OPTIONS`` (``max_model_len``, ``max_num_seqs``,
``prefix_caching``, ``seed``): an in-process, eager vLLM ``LLM``.
"""

from __future__ import annotations

import os

HF_DTYPES = ("float32", "bfloat16", "float16", "float64")
MINIRL_PRESETS = ("aligned", "typical", "hf_exact")  # Knobs classmethods: aligned(), typical_inference(), hf_exact()
ENGINES = ("hf", "minirl", "vllm")
HF_OPTIONS = {"attn": ("eager", "sdpa"), "experts": ("eager", "grouped_mm", "batched_mm")}
"""transformers' ``attn_implementation`` / ``experts_implementation``: a trainer's choice that
changes its numerics (sdpa vs eager differ by up to 0.39 in a bf16 MoE token logprob)."""


def parse_engine_spec(spec: str) -> tuple[str, str | None, dict[str, object]]:
    """``"minirl:aligned,rmsnorm=fused_add"`` -> ``("minirl", "aligned", {"rmsnorm": "fused_add"})``.

    Raises ValueError naming the problem: unknown engine, preset, knob or a value that does
    not convert to the knob's type.
    """
    text = spec.strip()
    cut = min((i for i in (text.find(":"), text.find(",")) if i >= 0), default=len(text))
    name, rest = text[:cut], text[cut + 1:]  # "minirl,rmsnorm=hf" has overrides but no preset
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r} in {spec!r}; engines: {', '.join(ENGINES)}")
    items = [x.strip() for x in rest.split(",") if x.strip()] if rest else []
    preset = items.pop(0) if items and "=" not in items[0] else None
    presets = MINIRL_PRESETS if name == "minirl" else HF_DTYPES
    if preset is not None and preset not in presets:
        raise ValueError(f"unknown {name} preset {preset!r} in {spec!r}; presets: {', '.join(presets)}")
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"expected knob=value after the preset in {spec!r}; got {bad}")
    from minirl.rollout_engine import spec_options

    raw = spec_options(spec, items)  # a repeated key is refused by name
    if name == "hf":
        return name, preset, {k.strip(): hf_option(k.strip(), v.strip()) for k, v in raw.items()}
    if name == "vllm":
        from aligntools.adapters.vllm_engine import parse_options

        return name, preset, parse_options(spec, {k.strip(): v.strip() for k, v in raw.items()})
    return name, preset, {k.strip(): knob_value(k.strip(), v.strip()) for k, v in raw.items()}


def hf_option(name: str, value: str) -> str:
    """A checked ``hf`` engine option (``attn=sdpa``); unknown names or values list the valid ones."""
    if name not in HF_OPTIONS:
        valid = "; ".join(f"{k}={'|'.join(v)}" for k, v in HF_OPTIONS.items())
        raise ValueError(f"unknown hf option {name!r}; valid options: {valid}")
    if value not in HF_OPTIONS[name]:
        raise ValueError(f"hf option {name}={value!r}; valid values: {', '.join(HF_OPTIONS[name])}")
    return value


def knob_value(name: str, text: str) -> object:
    """Text -> the typed value of Knobs field ``name`` (``Knobs.parse_value``: one parser for
    every engine spec); unknown names raise with the list of valid knobs."""
    from minirl import Knobs

    return Knobs.parse_value(name, text)


def minirl_knobs(preset: str | None, overrides: dict[str, object]):
    """Knobs of a minirl spec: the preset (default ``typical``) with the overrides applied."""
    from minirl import Knobs

    return Knobs.preset(preset or "typical").replace(**overrides).validate()


def minirl_default_dtype(preset: str | None) -> str:
    """bfloat16 for ``typical`` (what inference servers run), float32 for the aligned presets."""
    return "bfloat16" if (preset or "typical") == "typical" else "float32"


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


def load_target(spec: str, path: str | os.PathLike, dtype: str | None = None) -> object:
    """Build the engine a spec names on checkpoint ``path``: a transformers model (``hf``,
    dtype from the preset or ``dtype``), a minirl Engine (knobs from preset + overrides) or an
    in-process vLLM ``LLM`` (``vllm``, dtype from the preset or ``dtype``, default float32)."""
    name, preset, overrides = parse_engine_spec(spec)
    if name == "hf":
        return load_hf(path, preset or dtype or "float32", **overrides)
    if name == "vllm":
        from aligntools.adapters.vllm_engine import create_llm

        return create_llm(path, preset or dtype or "float32", **overrides)
    from minirl import Engine

    return Engine.from_pretrained(path, dtype=dtype or minirl_default_dtype(preset),
                                  knobs=minirl_knobs(preset, overrides))
