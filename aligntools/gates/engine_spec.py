"""Engine specs on the command line: ``hf``, ``hf:bfloat16``, ``minirl:aligned,rmsnorm=fused_add``.

One grammar for every CLI that names an engine (``mlab capture``, ``mlab check``):
``NAME[:PRESET][,knob=value...]`` (the first item after ``:`` may itself be a knob). For
``hf`` the preset is a dtype; for ``minirl`` it is a Knobs preset (``typical``, ``aligned``
or ``hf_exact``) and the overrides are Knobs fields, converted from text with the field's type.
"""

from __future__ import annotations

import os

HF_DTYPES = ("float32", "bfloat16", "float16")
MINIRL_PRESETS = ("aligned", "typical", "hf_exact")  # Knobs classmethods: aligned(), typical_inference(), hf_exact()
ENGINES = ("hf", "minirl")


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
    presets = HF_DTYPES if name == "hf" else MINIRL_PRESETS
    if preset is not None and preset not in presets:
        raise ValueError(f"unknown {name} preset {preset!r} in {spec!r}; presets: {', '.join(presets)}")
    raw = dict(item.split("=", 1) for item in items if "=" in item)
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"expected knob=value after the preset in {spec!r}; got {bad}")
    if raw and name == "hf":
        raise ValueError(f"the hf engine takes no knobs (got {sorted(raw)}); knobs are minirl's")
    return name, preset, {k.strip(): knob_value(k.strip(), v.strip()) for k, v in raw.items()}


def knob_value(name: str, text: str) -> object:
    """Text -> the typed value of Knobs field ``name`` (``Knobs.parse_value``: one parser for
    every engine spec); unknown names raise with the list of valid knobs."""
    from minirl import Knobs

    return Knobs.parse_value(name, text)


def minirl_knobs(preset: str | None, overrides: dict[str, object]):
    """Knobs of a minirl spec: the preset (default ``typical``) with the overrides applied."""
    from minirl import Knobs

    factory = {"aligned": Knobs.aligned, "typical": Knobs.typical_inference, "hf_exact": Knobs.hf_exact}
    return factory[preset or "typical"]().replace(**overrides).validate()


def minirl_default_dtype(preset: str | None) -> str:
    """bfloat16 for ``typical`` (what inference servers run), float32 for the aligned presets."""
    return "bfloat16" if (preset or "typical") == "typical" else "float32"


def load_hf(path: str | os.PathLike, dtype: str):
    """The lab's training engine: transformers with eager attention and the per-expert MoE loop.

    Why eager: it is the plain PyTorch math a trainer differentiates through, it runs in
    float64 (the noise-floor reference; the grouped_mm experts path has no float64), and it is
    what ``Knobs.hf_exact()`` reproduces bit for bit.
    """
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), attn_implementation="eager",
        experts_implementation="eager").eval()


def load_target(spec: str, path: str | os.PathLike, dtype: str | None = None) -> object:
    """Build the engine a spec names on checkpoint ``path``: a transformers model (``hf``,
    dtype from the preset or ``dtype``) or a minirl Engine (knobs from preset + overrides)."""
    name, preset, overrides = parse_engine_spec(spec)
    if name == "hf":
        return load_hf(path, preset or dtype or "float32")
    from minirl import Engine

    return Engine.from_pretrained(path, dtype=dtype or minirl_default_dtype(preset),
                                  knobs=minirl_knobs(preset, overrides))
