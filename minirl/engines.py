"""Engine kinds: one table of what each kind takes, one spec type, one builder.

Why one table: ``mlab capture``, ``mlab check``, ``aligntools.attribute`` and the trainer's
``TrainConfig.engine`` all name engines, and each used to keep its own idea of a kind (two
builders, dtype lists and default dtypes in three places, ``kind ==`` chains in six files).
``KINDS`` holds, per kind, its dtypes, its default dtype (per preset where it has presets), its
options with their types, its constructor and how the trainer talks to it. ``EngineSpec`` reads
a spec's text with the grammar of ``minirl.engine.spec`` and checks it against the row;
``build_engine`` is the only place an engine is made from a spec.

The dtype rule, the same for every caller (``mlab check`` / ``capture`` / ``train``): the
spec's dtype, else the dtype the caller was given (``--dtype``, ``TrainConfig.engine_dtype``),
else the kind's default from the table; a spec and a given dtype that disagree are refused.

Third-party rollout engines come from the ``minirl.engines`` entry-point group (``NAME =
"module:factory"``, ``factory(spec_text, model_path, dtype) -> engine``, ``dtype`` None = the
plugin's own default): ``build_engine(..., rollouts=True)`` looks a kind it does not know up there.

One card: the minirl ``Engine`` is built on the trainer's device, so rollouts, the trainer's
forward and the weight sync share one GPU and the sync is a device-to-device copy. It stays a
copy, never an alias of the trainer's parameters: the engine fuses and rounds weights into its
own tensors (and ``Knobs.weights`` quantizes them) at fixed addresses a CUDA graph reads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol, runtime_checkable

import torch

from minirl.engine import spec as grammar
from minirl.engine.knobs import Knobs
from minirl.engine.ops import DTYPES as ENGINE_DTYPES
from minirl.engine.rollout import Rollout
from minirl.engine.sampling import SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer talks to: rollouts with raw logprobs (and routed experts for R3), and an
    in-place weight sync from the training model. Pass one to ``minirl.train(config, engine=...)``."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]: ...

    def load_weights(self, model: torch.nn.Module) -> None: ...


@dataclass(frozen=True)
class Options:
    """A kind's options: name -> its type (``int``, ``bool``) or its valid strings; ``sizes``: the int
    options that are sizes (at least 1), refused with the spec rather than when the engine starts."""

    kind: str
    types: Mapping[str, type | tuple[str, ...]]
    sizes: tuple[str, ...] = ()

    def read(self, name: str, text: str) -> object:
        """An option's spec text -> its typed value."""
        want = self._want(name)
        if isinstance(want, tuple):
            return text
        try:
            return grammar.to_bool(text) if want is bool else want(text)
        except ValueError:
            raise ValueError(f"{self.kind} option {name}={text!r} is not a {want.__name__}") from None

    def check(self, spec: EngineSpec) -> None:
        """Every option is known and holds a value of its type (a spec built in code too)."""
        for name, value in spec.options.items():
            want = self._want(name)
            if isinstance(want, tuple) and value not in want:
                raise ValueError(f"{self.kind} option {name}={value!r}; valid values: {', '.join(want)}")
            if isinstance(want, type) and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
                raise ValueError(f"{self.kind} option {name}={value!r} is not a {want.__name__}")
            if name in self.sizes and value < 1:
                raise ValueError(f"{self.kind} option {name}={value!r} is a size and must be at least 1; give a "
                                 f"positive {name}, or leave it out for the default")

    def _want(self, name: str) -> type | tuple[str, ...]:
        if name not in self.types:
            valid = "; ".join(f"{k}={'|'.join(t)}" if isinstance(t, tuple) else f"{k}=<{t.__name__}>"
                              for k, t in self.types.items())
            raise ValueError(f"unknown {self.kind} option {name!r}; valid options: {valid}")
        return self.types[name]


class KnobOptions:
    """minirl's options are its ``Knobs`` fields, typed and checked by ``Knobs`` itself (the one
    place knob values are checked), so a knob added there is a spec option with no edit here."""

    def read(self, name: str, text: str) -> object:
        return Knobs.parse_value(name, text)

    def check(self, spec: EngineSpec) -> None:
        spec.knobs()


@dataclass(frozen=True)
class EngineKind:
    """One row of ``KINDS``. ``presets``: preset -> the dtype it runs in unless told (minirl's
    ``Knobs`` presets); ``build(spec, path, device)`` makes the engine of a spec whose dtype is
    resolved; ``rollouts`` turns it into what the trainer talks to (None: it cannot roll out, as
    a transformers model cannot); ``settings`` is what a report records about a built engine;
    ``unavailable`` says why the kind cannot run here (None: it can)."""

    dtypes: tuple[str, ...]
    default_dtype: str
    options: Options | KnobOptions
    build: Callable[[EngineSpec, str | os.PathLike, str | torch.device], object]
    presets: Mapping[str, str] = field(default_factory=dict)
    default_preset: str | None = None
    rollouts: Callable[[object], RolloutEngine] | None = None
    settings: Callable[[object], dict] = lambda engine: {}
    unavailable: Callable[[], str | None] = lambda: None

    def head_name(self) -> str:
        return "preset or dtype" if self.presets else "dtype"


@dataclass(frozen=True)
class EngineSpec:
    """A parsed engine spec: ``kind`` (a ``KINDS`` key), ``dtype`` (None = the caller's or the
    kind's default), ``preset`` (None = the kind's default preset) and typed ``options``.
    Construction checks every field against the kind's row, so a spec built in code is held to
    the table as much as a parsed one."""

    kind: str
    dtype: str | None = None
    preset: str | None = None
    options: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        row = engine_kind(self.kind)
        if self.dtype is not None and self.dtype not in row.dtypes:
            raise ValueError(f"{self.dtype!r} is not a {self.kind} dtype; dtypes: {', '.join(row.dtypes)}")
        if self.preset is not None and self.preset not in row.presets:
            valid = f"presets: {', '.join(row.presets)}" if row.presets else f"{self.kind} has no presets"
            raise ValueError(f"unknown {self.kind} preset {self.preset!r}; {valid}")
        object.__setattr__(self, "options", dict(self.options))
        row.options.check(self)

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        """``"minirl:aligned,rmsnorm=fused_add"`` -> ``EngineSpec("minirl", None, "aligned",
        {"rmsnorm": "fused_add"})``. The head is a preset or a dtype, by the kind's row; ``dtype=``
        is accepted on every kind, so that a spec can carry a preset and a dtype. Raises ValueError
        naming the spec, the bad part and the valid values."""
        name, head, raw = grammar.split(text)
        row = engine_kind(name, text)
        dtype, preset = raw.pop("dtype", None), None
        if head in row.presets:
            preset = head
        elif head in row.dtypes and dtype is None:
            dtype = head
        elif head in row.dtypes:
            raise ValueError(f"engine spec {text!r} names the dtype twice ({head} and dtype={dtype})")
        elif head is not None:
            raise ValueError(f"engine spec {text!r}: {head!r} is not a {name} {row.head_name()} "
                             f"({', '.join((*row.presets, *row.dtypes))}) or key=value")
        try:
            return cls(name, dtype, preset, {k: row.options.read(k, v) for k, v in raw.items()})
        except ValueError as e:
            raise ValueError(f"engine spec {text!r}: {e}") from None

    def __str__(self) -> str:
        """The canonical text: ``EngineSpec.parse(str(spec)) == spec``."""
        head = self.preset if self.preset is not None else self.dtype
        tail = {**self.options, **({"dtype": self.dtype} if self.preset is not None and self.dtype else {})}
        return grammar.join(self.kind, head, tail)

    def engine_dtype(self, given: str | None = None) -> str:
        """The dtype the engine runs in: the spec's, else ``given``, else the kind's default
        (the preset's, where the kind has presets). Two different dtypes are refused: one of
        them would be silently ignored."""
        if self.dtype is not None and given is not None and given != self.dtype:
            raise ValueError(f"engine spec {str(self)!r} names dtype {self.dtype} but the dtype given is {given} "
                             f"(--dtype / engine_dtype); give one of them, or the same in both")
        row = KINDS[self.kind]
        return self.dtype or given or row.presets.get(self.preset or row.default_preset, row.default_dtype)

    def knobs(self) -> Knobs:
        """The ``Knobs`` of a minirl spec: the preset (default typical) with the options applied,
        validated (``Knobs.validate``)."""
        if not isinstance(KINDS[self.kind].options, KnobOptions):
            raise ValueError(f"engine spec {str(self)!r} is not a minirl spec: only minirl has knobs")
        return Knobs.preset(self.preset or KINDS[self.kind].default_preset).replace(**self.options).validate()

    def replace(self, **changes: object) -> EngineSpec:
        """A checked copy with some fields changed (``options`` replaces the whole dict)."""
        return dataclasses.replace(self, **changes)


def engine_kind(name: str, text: str | None = None) -> EngineKind:
    """The row of kind ``name``; an unknown kind raises naming the kinds (and the spec ``text``)."""
    if name not in KINDS:
        where = f"engine spec {text!r}: " if text is not None else ""
        raise ValueError(f"{where}unknown engine {name!r}; engines: {', '.join(KINDS)}")
    return KINDS[name]


def plugins() -> dict[str, EntryPoint]:
    """Third-party rollout engines: the ``minirl.engines`` entry points of installed packages."""
    return {ep.name: ep for ep in entry_points(group="minirl.engines")}


def resolve(spec: EngineSpec | str, dtype: str | None = None, rollouts: bool = False) -> EngineSpec | None:
    """``spec`` checked, with its dtype resolved (the module's rule); ``rollouts``: it must be a
    kind the trainer can roll out with, or a plugin (None: the plugin reads its own spec). Runs
    before any model loads, so a typo costs nothing (``TrainConfig`` calls it in its checks)."""
    name = grammar.split(spec)[0] if isinstance(spec, str) and rollouts else None
    if name is not None and name not in KINDS:
        if name in plugins():
            return None
        raise ValueError(f"engine spec {spec!r}: unknown engine {name!r}; engines here: "
                         f"{', '.join([k for k, r in KINDS.items() if r.rollouts] + sorted(plugins()))} "
                         f"(others come from the 'minirl.engines' entry points of installed packages)")
    if isinstance(spec, str):
        spec = EngineSpec.parse(spec)
    if rollouts and KINDS[spec.kind].rollouts is None:
        raise ValueError(f"engine spec {str(spec)!r}: a {spec.kind} engine cannot generate rollouts; use one of "
                         f"{', '.join(k for k, r in KINDS.items() if r.rollouts)}")
    return spec.replace(dtype=spec.engine_dtype(dtype))


def build_engine(spec: EngineSpec | str, path: str | os.PathLike, dtype: str | None = None,
                 device: str | torch.device = "cpu", rollouts: bool = False) -> object:
    """The engine ``spec`` names on checkpoint ``path``: a transformers model (``hf``), a minirl
    ``Engine`` on ``device`` or an in-process, eager vLLM ``LLM`` (``vllm``). ``dtype`` is used
    when the spec names none (module docstring). ``rollouts``: the engine as the trainer talks to
    it (a ``RolloutEngine``: vLLM's ``LLM`` wrapped, a plugin looked up, ``hf`` refused)."""
    resolved = resolve(spec, dtype, rollouts)
    if resolved is None:
        return plugins()[grammar.split(spec)[0]].load()(spec, path, dtype)
    row = KINDS[resolved.kind]
    engine = row.build(resolved, path, device)
    return row.rollouts(engine) if rollouts else engine


def load_hf(path: str | os.PathLike, dtype: str, attn: str | None = None, experts: str | None = None):
    """The training engine: a transformers model, loaded the way a trainer would. ``attn`` /
    ``experts`` None = transformers' own defaults (what a stock trainer runs); float64 always
    uses the eager experts loop, because grouped_mm has no float64 kernel."""
    import transformers

    kwargs = {k: v for k, v in (("attn_implementation", attn), ("experts_implementation", experts)) if v}
    if dtype == "float64":
        kwargs["experts_implementation"] = "eager"
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), **kwargs).eval()


def _minirl(spec: EngineSpec, path: str | os.PathLike, device: str | torch.device) -> object:
    from minirl.engine.engine import Engine

    return Engine.from_pretrained(path, spec.dtype, spec.knobs(), device=device)


def _minirl_settings(engine: object) -> dict:
    kept = engine.unquantized  # weights the quantization format cannot hold, in full precision
    return {**engine.knobs.to_dict(), **({"unquantized": ", ".join(sorted(kept))} if kept else {})}


def _vllm(spec: EngineSpec, path: str | os.PathLike, device: str | torch.device) -> object:
    from minirl.vllm.llm import create_llm  # imports vLLM: only when asked for

    return create_llm(path, spec.dtype, **spec.options)


def _vllm_rollouts(llm: object) -> RolloutEngine:
    from minirl.vllm.rollouts import VllmRollouts

    return VllmRollouts(llm)


def _vllm_settings(llm: object) -> dict:
    from minirl.vllm.llm import engine_settings

    return engine_settings(llm)


def _vllm_unavailable() -> str | None:
    from minirl.vllm.llm import unavailable_reason

    return unavailable_reason()


def _sglang(spec: EngineSpec, path: str | os.PathLike, device: str | torch.device) -> object:
    from minirl.sglang.runner import create_runner  # imports SGLang: only when asked for

    return create_runner(path, spec.dtype, **spec.options)


def _sglang_rollouts(runner: object) -> RolloutEngine:
    from minirl.sglang.rollouts import SglangRollouts

    return SglangRollouts(runner)


def _sglang_unavailable() -> str | None:
    from minirl.sglang.runner import unavailable_reason

    return unavailable_reason()


KINDS: dict[str, EngineKind] = {
    "hf": EngineKind(
        dtypes=("float32", "bfloat16", "float16", "float64"), default_dtype="float32",  # the training engine
        options=Options("hf", {"attn": ("eager", "sdpa"), "experts": ("eager", "grouped_mm", "batched_mm")}),
        build=lambda spec, path, device: load_hf(path, spec.dtype, **spec.options)),
    "minirl": EngineKind(
        dtypes=tuple(ENGINE_DTYPES), default_dtype="bfloat16", options=KnobOptions(), build=_minirl,
        presets={"aligned": "float32", "typical": "bfloat16", "hf_exact": "float32"}, default_preset="typical",
        rollouts=lambda engine: engine, settings=_minirl_settings),
    "vllm": EngineKind(
        dtypes=("float32", "bfloat16", "float16"), default_dtype="bfloat16",  # no float64 kernels on CPU; a server's dtype
        options=Options("vllm", {"max_model_len": int, "max_num_seqs": int, "prefix_caching": bool, "seed": int},
                        sizes=("max_model_len", "max_num_seqs")),
        build=_vllm, rollouts=_vllm_rollouts, settings=_vllm_settings, unavailable=_vllm_unavailable),
    "sglang": EngineKind(
        dtypes=("float32", "bfloat16", "float16"), default_dtype="bfloat16",  # SGLang's CPU path (docs/sglang.md)
        options=Options("sglang", {"max_total_tokens": int}, sizes=("max_total_tokens",)), build=_sglang,
        rollouts=_sglang_rollouts, settings=lambda runner: runner.settings(), unavailable=_sglang_unavailable),
}
"""Every engine kind. hf: transformers (``attn`` / ``experts``: ``attn_implementation`` /
``experts_implementation``, a trainer's choice that changes its numerics; unset = what
``from_pretrained`` picks). minirl: ``minirl.engine.Engine``, its options the ``Knobs``. vllm:
in-process eager vLLM (CPU build), the ``LLM`` settings a spec may change. sglang: an in-process
SGLang ``ModelRunner`` (``minirl.sglang.runner``), ``max_total_tokens`` its KV pool."""
