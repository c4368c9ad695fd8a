"""Engine specs: the one grammar every place that names an engine reads.

    hf[:DTYPE][,attn=eager|sdpa][,experts=eager|grouped_mm|batched_mm]
    minirl[:PRESET|DTYPE][,knob=value...][,dtype=DTYPE]
    vllm[:DTYPE][,max_model_len=N][,max_num_seqs=N][,prefix_caching=BOOL][,seed=N]

Why one module: ``mlab capture`` / ``mlab check``, ``aligntools.attribute``, the trainer's
``TrainConfig.engine`` and the vLLM rollout plugin used to parse specs with three parsers that
disagreed (``minirl:rmsnorm=hf`` was an override in one and an unknown preset in another; vLLM
defaulted to float32 in one builder and bfloat16 in the other). ``EngineSpec.parse`` is now the
only reader and ``EngineSpec.engine_dtype`` the only place a default dtype is chosen.

The first item after ``:`` is the head (a dtype; for minirl a Knobs preset or a dtype) unless it
holds ``=``, so ``minirl:tp=2`` sets a knob on the default preset. ``dtype=`` is accepted on every
kind so that a minirl spec can carry a preset and a dtype (``minirl:aligned,dtype=bfloat16``, how
``str()`` writes it). minirl lives below aligntools, so the grammar lives here and aligntools
reaches it through minirl's front door (``from minirl import EngineSpec``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from minirl.engine.ops import DTYPES as ENGINE_DTYPES

KINDS = ("hf", "minirl", "vllm")
DTYPES = {"hf": ("float32", "bfloat16", "float16", "float64"),
          "minirl": tuple(ENGINE_DTYPES),  # what minirl's Engine implements
          "vllm": ("float32", "bfloat16", "float16")}  # vLLM's CPU build has no float64 kernels
PRESETS = ("aligned", "typical", "hf_exact")  # Knobs.preset names; minirl only
HF_OPTIONS: dict[str, tuple[str, ...]] = {"attn": ("eager", "sdpa"), "experts": ("eager", "grouped_mm", "batched_mm")}
"""transformers' ``attn_implementation`` / ``experts_implementation``: a trainer's choice that
changes its numerics (sdpa vs eager differ by up to 0.39 in a bf16 MoE token logprob); unset =
what ``from_pretrained`` picks (sdpa and grouped_mm on CPU in transformers 5.23)."""
VLLM_OPTIONS: dict[str, type] = {"max_model_len": int, "max_num_seqs": int, "prefix_caching": bool, "seed": int}
"""The vLLM ``LLM`` settings a spec may change; everything else is fixed (eager, in process)."""
DEFAULT_DTYPE = {"hf": "float32", "vllm": "bfloat16"}
"""hf: float32, the training engine. vllm: bfloat16, what an inference server runs (and what the
RL trainer's ``engine_dtype`` defaults to). minirl: bfloat16 for ``typical``, float32 for the
aligned presets (``EngineSpec.engine_dtype``)."""


@dataclass(frozen=True)
class EngineSpec:
    """A parsed engine spec: ``kind`` (hf, minirl, vllm), ``dtype`` (None = the caller's or the
    kind's default), ``preset`` (minirl's Knobs preset; None = typical) and typed ``options``
    (hf/vllm settings or minirl knob overrides). Construction checks every field, so a spec
    built in code is held to the grammar as much as a parsed one."""

    KINDS: ClassVar[tuple[str, ...]] = KINDS
    PRESETS: ClassVar[tuple[str, ...]] = PRESETS

    kind: str
    dtype: str | None = None
    preset: str | None = None
    options: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown engine {self.kind!r}; engines: {', '.join(KINDS)}")
        if self.dtype is not None and self.dtype not in DTYPES[self.kind]:
            raise ValueError(f"{self.dtype!r} is not a {self.kind} dtype; dtypes: {', '.join(DTYPES[self.kind])}")
        if self.preset is not None and (self.kind != "minirl" or self.preset not in PRESETS):
            valid = f"presets: {', '.join(PRESETS)}" if self.kind == "minirl" else "only minirl has presets"
            raise ValueError(f"unknown {self.kind} preset {self.preset!r}; {valid}")
        object.__setattr__(self, "options", dict(self.options))
        if self.kind == "hf":
            for name, value in self.options.items():
                _check_hf_option(name, value)
        elif self.kind == "vllm":
            for name, value in self.options.items():
                _check_vllm_option(name, value)
        else:
            self.knobs()  # unknown knobs and invalid values raise here, naming the knob

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        """``"minirl:aligned,rmsnorm=fused_add"`` -> ``EngineSpec("minirl", None, "aligned",
        {"rmsnorm": "fused_add"})``. Raises ValueError naming the spec, the bad part and the
        valid values."""
        if not isinstance(text, str):
            raise TypeError(f"an engine spec is a string such as 'minirl:typical'; got {type(text).__name__}")
        spec = text.strip()
        cut = min((i for i in (spec.find(":"), spec.find(",")) if i >= 0), default=len(spec))
        kind, rest = spec[:cut].strip(), spec[cut + 1:]
        if kind not in KINDS:
            raise ValueError(f"engine spec {text!r}: unknown engine {kind!r}; engines: {', '.join(KINDS)}")
        items = [x.strip() for x in rest.split(",")] if rest.strip() else []
        if "" in items:  # "minirl:,," ran the defaults while "minirl:typical,=1" was refused
            raise ValueError(f"engine spec {text!r} has an empty item between commas; give "
                             f"{kind}[:{_head_name(kind)}][,key=value...] without empty items")
        head = items.pop(0) if items and "=" not in items[0] else None
        bad = [item for item in items if "=" not in item]
        if bad:
            raise ValueError(f"engine spec {text!r}: expected key=value after the {_head_name(kind)}; got {bad}")
        raw = _key_values(text, items)
        dtype = raw.pop("dtype", None)
        preset = None
        if head is not None:
            if kind == "minirl" and head in PRESETS:
                preset = head
            elif head in DTYPES[kind] and dtype is None:
                dtype = head
            elif head in DTYPES[kind]:
                raise ValueError(f"engine spec {text!r} names the dtype twice ({head} and dtype={dtype})")
            else:
                raise ValueError(f"engine spec {text!r}: {head!r} is not a {kind} {_head_name(kind)} "
                                 f"({_head_values(kind)}) or key=value")
        try:
            return cls(kind, dtype, preset, {k: _typed(kind, k, v) for k, v in raw.items()})
        except ValueError as e:
            raise ValueError(f"engine spec {text!r}: {e}") from None

    def __str__(self) -> str:
        """The canonical text: ``EngineSpec.parse(str(spec)) == spec``."""
        head = self.preset if self.preset is not None else self.dtype
        tail = {**self.options, **({"dtype": self.dtype} if self.preset is not None and self.dtype else {})}
        return self.kind + (f":{head}" if head else "") + "".join(f",{k}={_text(v)}" for k, v in tail.items())

    def engine_dtype(self, given: str | None = None) -> str:
        """The dtype the engine runs in: the spec's, else ``given`` (``--dtype``, a run's
        ``engine_dtype``), else the kind's default (``DEFAULT_DTYPE``). A spec and a caller
        naming two different dtypes is refused: one of them would be silently ignored."""
        if self.dtype is not None and given is not None and given != self.dtype:
            raise ValueError(f"engine spec {str(self)!r} names dtype {self.dtype} but the dtype given is {given} "
                             f"(--dtype / engine_dtype); give one of them, or the same in both")
        if self.dtype is not None or given is not None:
            return self.dtype or given
        if self.kind == "minirl":
            return "bfloat16" if (self.preset or "typical") == "typical" else "float32"
        return DEFAULT_DTYPE[self.kind]

    def knobs(self):
        """The minirl ``Knobs`` of a minirl spec: the preset (default typical) with the options
        applied, validated (``Knobs.validate``: the one place knob values are checked)."""
        from minirl.engine.knobs import Knobs

        if self.kind != "minirl":
            raise ValueError(f"engine spec {str(self)!r} is not a minirl spec: only minirl has knobs")
        return Knobs.preset(self.preset or "typical").replace(**self.options).validate()

    def replace(self, **changes: object) -> EngineSpec:
        """A checked copy with some fields changed (``options`` replaces the whole dict)."""
        return dataclasses.replace(self, **changes)


def _head_name(kind: str) -> str:
    return "preset or dtype" if kind == "minirl" else "dtype"


def _head_values(kind: str) -> str:
    return ", ".join((PRESETS if kind == "minirl" else ()) + DTYPES[kind])


def _key_values(text: str, items: list[str]) -> dict[str, str]:
    """``["tp=2", "rmsnorm = hf"]`` -> ``{"tp": "2", "rmsnorm": "hf"}``; a repeated key is refused
    (in a dict the last one would win without a word: ``tp=2,tp=4`` ran tp=4)."""
    pairs = [(key.strip(), value.strip()) for key, _, value in (item.partition("=") for item in items)]
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            given = ",".join(f"{k}={v}" for k, v in pairs if k == key)
            raise ValueError(f"engine spec {text!r} sets option {key!r} more than once ({given}); give each "
                             f"option once")
        out[key] = value
    return out


def _typed(kind: str, name: str, text: str) -> object:
    """An option's text -> its value: hf options stay strings, vLLM options take their
    ``VLLM_OPTIONS`` type, minirl knobs their field's type (``Knobs.parse_value``)."""
    if kind == "hf":
        return text
    if kind == "vllm":
        _check_vllm_option(name, None)
        want = VLLM_OPTIONS[name]
        try:
            return _to_bool(text) if want is bool else want(text)
        except ValueError:
            raise ValueError(f"vllm option {name}={text!r} is not a {want.__name__}") from None
    from minirl.engine.knobs import Knobs

    return Knobs.parse_value(name, text)


def _check_hf_option(name: str, value: object) -> None:
    if name not in HF_OPTIONS:
        valid = "; ".join(f"{k}={'|'.join(v)}" for k, v in HF_OPTIONS.items())
        raise ValueError(f"unknown hf option {name!r}; valid options: {valid}")
    if value not in HF_OPTIONS[name]:
        raise ValueError(f"hf option {name}={value!r}; valid values: {', '.join(HF_OPTIONS[name])}")


def _check_vllm_option(name: str, value: object) -> None:
    """Known name; ``value`` (None: only the name is checked) of the option's type."""
    if name not in VLLM_OPTIONS:
        valid = ", ".join(f"{k}=<{t.__name__}>" for k, t in VLLM_OPTIONS.items())
        raise ValueError(f"unknown vllm option {name!r}; valid options: {valid}")
    want = VLLM_OPTIONS[name]
    if value is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
        raise ValueError(f"vllm option {name}={value!r} is not a {want.__name__}")


def _to_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _text(value: object) -> str:
    """A typed option back to spec text (``True`` -> ``true``, ``None`` -> ``none``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)
