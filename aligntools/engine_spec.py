"""Engine specs on the command line: ``hf``, ``hf:bfloat16``, ``minirl:aligned,rmsnorm=fused_add``.

One grammar for every CLI that names an engine (``mlab capture``, ``mlab check``):
``NAME[:PRESET][,knob=value...]`` (the first item after ``:`` may itself be a knob). For
``hf`` the preset is a dtype; for ``minirl`` it is a Knobs preset (``aligned`` or
``typical``) and the overrides are Knobs fields, converted from text with the field's type.
"""

from __future__ import annotations

import dataclasses
import os
import typing

HF_DTYPES = ("float32", "bfloat16", "float16")
MINIRL_PRESETS = ("aligned", "typical")
ENGINES = ("hf", "minirl")


def parse_engine_spec(spec: str) -> tuple[str, str | None, dict[str, object]]:
    """``"minirl:aligned,rmsnorm=fused_add"`` -> ``("minirl", "aligned", {"rmsnorm": "fused_add"})``.

    Raises ValueError naming the problem: unknown engine, preset, knob or a value that does
    not convert to the knob's type.
    """
    name, _, rest = spec.strip().partition(":")
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
    """Convert ``text`` to the type of Knobs field ``name`` (``tp=2``, ``batch_invariant=true``,
    ``rmsnorm_eps=none``); unknown names raise with the list of valid knobs."""
    from minirl import Knobs

    hints = typing.get_type_hints(Knobs)
    names = [f.name for f in dataclasses.fields(Knobs)]
    if name not in names:
        raise ValueError(f"unknown knob {name!r}; valid knobs: {', '.join(names)}")
    kind = hints[name]
    options = typing.get_args(kind) or (kind,)
    if type(None) in options and text.lower() in ("none", "null"):
        return None
    for t in (o for o in options if o is not type(None)):
        if t is bool:
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"knob {name} is a bool (true/false); got {text!r}")
        try:
            return t(text)
        except ValueError:
            continue
    raise ValueError(f"knob {name} expects {kind}; got {text!r}")


def load_target(spec: str, path: str | os.PathLike, dtype: str | None = None) -> object:
    """Build the engine a spec names on checkpoint ``path``: a transformers model (``hf``,
    dtype from the preset or ``dtype``) or a minirl Engine (knobs from preset + overrides;
    default dtype float32 for ``aligned``, bfloat16 for ``typical``)."""
    import torch

    name, preset, overrides = parse_engine_spec(spec)
    if name == "hf":
        import transformers

        chosen = preset or dtype or "float32"
        return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, chosen)).eval()
    from minirl import Engine, Knobs

    preset = preset or "typical"
    knobs = (Knobs.aligned() if preset == "aligned" else Knobs.typical_inference()).replace(**overrides)
    return Engine.from_pretrained(path, dtype=dtype or ("float32" if preset == "aligned" else "bfloat16"),
                                  knobs=knobs)
