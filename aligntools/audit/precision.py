"""Engine weights and numerics the trainer can reproduce: cause ``quantized_layers`` and the fingerprint of
the ``numeric`` remainder.

Why: a gap no semantic cause explains is still made by *something* the engine did differently, and two
kinds of it can be re-enacted on a copy of the trainer's model and re-scored like ``stale_weights``:

- ``quantized_layers``: layers served quantized while the trainer keeps them in full precision (vLLM PR
  #44628: an FP8 checkpoint's short ``modules_to_not_convert`` patterns silently quantized layers meant to
  stay bf16). Each minirl weight format (``minirl.engine.quantize``) on each layer group is one candidate;
  rounding is deterministic, so the right one reproduces the engine to the noise floor and is named;
- the fingerprint: which precision choice (bf16 everywhere, bf16 lm_head only, bf16 norms, ...) reproduces
  the remainder best, as the share of the gap each removes. A bf16 engine's decode differs from a bf16
  re-score (another reduction order), so shares stay below 1: they rank the choices, they do not prove one.
  ``replay`` then runs a record through the minirl engine computing as the best one, site by site, to
  where its numerics first part from the trainer's.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from aligntools.audit.by_size import REPRODUCES, by_size
from aligntools.audit.registry import ACCEPT, Fit, register_cause
from aligntools.audit.state import Context, State, gap
from aligntools.records import Record, read

if TYPE_CHECKING:
    from aligntools.analyzer.tolerance import Tolerance

SCHEMES = ("fp8_e4m3", "fp8_e4m3_tensor", "int8", "int4")
"""minirl's weight formats (``minirl.engine.quantize.FORMATS`` less ``none``)."""
COARSE = ("all", "linear", "attention", "mlp", "lm_head", "embeddings")
"""Layer groups tried with every scheme: ``all`` matrices (a GGUF file's), ``linear``, what
``minirl.Knobs(weights=...)`` quantizes (attention and MLP matrices; router, embeddings and lm_head kept),
and its parts. The best scheme is then tried on each decoder layer alone (``layer i``), unless a group
already reproduces the engine (``EXACT``): every scheme on every layer would cost layers x schemes screens."""
REACH_MARGIN = 2.0
"""A scheme is screened only if, on ``all`` matrices, it moves the logprobs by at least (1 - ``ACCEPT``) of
the gap over this margin. Why: a candidate c is named only if |engine - c| <= ACCEPT * |engine - trainer|,
so (triangle inequality) |c - trainer| >= (1 - ACCEPT) * gap; the scheme on all matrices moves them the
most (more rounded matrices, more independent error), and the margin covers that heuristic. A temperature
or truncation gap of 0.2 nats is out of reach of fp8 (0.02 on the tiny models) and skips its 25 screens."""
SCREEN_TOKENS = 32
"""Completion tokens (the first records holding them, or the first record's first ones) every quantization
candidate is re-scored on: the right candidate reproduces each token to the noise floor, a wrong one misses
each by its rounding, so a few dozen tokens rank them; only the winner is re-scored on every record. A
screen is one forward (smollm2-135m over 70 tokens: 1.1 s on one loaded core)."""
EXACT = 0.01
"""A candidate whose screened gap is below this fraction of the trainer's reproduces the engine: no single
layer can do better, and the per-layer screen (one forward per layer) is skipped."""
FINGERPRINT_TOKENS = 256
"""Tokens the fingerprint re-scores per candidate (the first records holding them): a precision choice is
systematic, a few hundred tokens rank the candidates (8 candidates: 8 re-scores of them)."""


REPLAY_TOKENS = 64
"""Completion tokens of the first record the replay captures on both sides: where two numerics first part
is a property of the sites, seen on the first tokens as on all (a 264-token capture pair of smollm2-135m
took 9 s of a 143 s audit; docs/measurements/2026-12-07-audit-speed.md)."""


def layer_groups(model: nn.Module) -> dict[str, list[str]]:
    """Parameter names of the matrices [.., out, in] of each layer group (``COARSE``, then ``layer i``);
    a group holding the same tensors as an earlier one (a tied lm_head) is left out."""
    from aligntools.adapters.roles import find_roles

    roles = find_roles(model, getattr(model, "config", None))
    if roles is None:
        return {}
    names = {id(p): n for n, p in model.named_parameters()}
    routers = {id(p) for lr in roles.layers if lr.router is not None for p in lr.router.parameters()}

    def matrices(*modules: nn.Module | None) -> list[str]:
        return [names[id(p)] for m in modules if m is not None for p in m.parameters()
                if p.ndim >= 2 and id(p) not in routers]

    attn = [n for lr in roles.layers for n in matrices(lr.attn)]
    mlp = [n for lr in roles.layers for n in matrices(lr.mlp)]
    head, embed = matrices(roles.lm_head), matrices(roles.embed)
    groups = {"all": list(dict.fromkeys(attn + mlp + head + embed)), "linear": attn + mlp, "attention": attn,
              "mlp": mlp, "lm_head": head, "embeddings": embed,
              **{f"layer {lr.index}": matrices(lr.attn, lr.mlp) for lr in roles.layers}}
    out: dict[str, list[str]] = {}
    for name, group in groups.items():
        if group and set(group) not in [set(g) for g in out.values()]:
            out[name] = group
    return out


def quantized(model: nn.Module, names: Iterable[str], fmt: str) -> dict[str, torch.Tensor]:
    """The matrices ``names`` of ``model`` rounded to ``fmt`` and dequantized, by name (those the format cannot
    hold, int4 on a width not a multiple of 32, are left out: minirl's engine keeps them in full precision)."""
    from minirl import fake_quantize, unfit

    return {n: fake_quantize(p, fmt, n) for n in names if unfit(fmt, (p := model.get_parameter(n)).shape) is None}


def served(model: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of ``model`` with ``weights`` (by parameter name) in place of its own."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, w in weights.items():
            out.get_parameter(name).copy_(w)
    return out


def _screen_context(ctx: Context) -> Context:
    """The first records holding ``SCREEN_TOKENS`` tokens, the first one cut to them where it alone holds
    more (a long completion): a prefix of ``ctx``'s rows, so the state's processors read the same rows."""
    sub, n = ctx.head(SCREEN_TOKENS)
    if n <= SCREEN_TOKENS:
        return sub
    r = sub.records[0]
    cut = dataclasses.replace(r, completion_ids=r.completion_ids[:SCREEN_TOKENS], logprobs=r.logprobs[:SCREEN_TOKENS])
    return Context.of([cut], ctx.model, ctx.vocab)


BATCH_ELEMENTS = 1 << 25
"""Logits (records x padded rows x vocabulary) one right-padded forward may hold: 128 MB in fp32."""


class _Padded:
    """Records scored in one right-padded forward: ``ids``, ``mask`` [B, L] and, for ``logits``, the rows of
    each record's completion tokens. Within float32 noise of ``score``'s one record at a time (other GEMM
    shapes), and a small model's short records cost ~1.7x less so (4 x 40 tokens of smollm2: 0.64 s
    against 1.1 s)."""

    def __init__(self, records: list[Record]) -> None:
        seqs = [list(r.prompt_ids) + list(r.completion_ids)[:-1] for r in records]
        self.ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)  # [B, L]
        self.mask = torch.zeros_like(self.ids)
        for i, s in enumerate(seqs):
            self.ids[i, :len(s)], self.mask[i, :len(s)] = torch.tensor(s), 1
        self.start = min(len(r.prompt_ids) for r in records) - 1  # lm_head only from the first completion row on
        self.rows = [slice(len(r.prompt_ids) - 1 - self.start, len(s) - self.start) for r, s in zip(records, seqs)]

    def logits(self, model: nn.Module, weights: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """[n, V]: the logits at every completion token, in the records' order (``weights``: substituted by name)."""
        kwargs = {"input_ids": self.ids, "attention_mask": self.mask, "logits_to_keep": self.ids.shape[1] - self.start}
        with torch.inference_mode():
            out = (torch.func.functional_call(model, weights, (), kwargs) if weights is not None
                   else model(**kwargs)).logits  # [B, L - start, V]: row t - start of record i predicts token t + 1
        logits = torch.cat([out[i, rows] for i, rows in enumerate(self.rows)])
        return logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 read as fp32, fp64 kept

    @staticmethod
    def groups(records: list[Record], vocab: int) -> list[_Padded]:
        """``records`` in consecutive groups of at most ``BATCH_ELEMENTS`` logits each (one record at least)."""
        out: list[list[Record]] = []
        for r in records:
            group = [*out[-1], r] if out else [r]
            rows = max(len(g.prompt_ids) + len(g.completion_ids) for g in group) - min(len(g.prompt_ids) for g in group)
            if out and len(group) * rows * vocab <= BATCH_ELEMENTS:
                out[-1] = group
            else:
                out.append([r])
        return [_Padded(g) for g in out]


class _Screen:
    """The modelled logprobs [n] of the screening records ``sub`` (``_screen_context``) with weights (by name)
    substituted in the trainer, under ``state``'s processors and shift: all records in one right-padded forward
    (``_Padded``) without a copy of the model; the winner is re-scored with ``score``. The trainer's own
    forward runs first and keeps each decoder layer's output; a candidate that changes layer i onward
    (``from_layer``) then runs only from there, the layers before returning their kept outputs (the same bits:
    the same layers on the same inputs), so the per-layer screens cost half a forward each on average."""

    def __init__(self, sub: Context, state: State) -> None:
        from aligntools.adapters.roles import find_roles

        self.sub, self.state, self.padded = sub, state, _Padded(sub.records)
        roles = find_roles(sub.model, getattr(sub.model, "config", None))
        self.layers = [lr.layer for lr in roles.layers] if roles else []
        self.kept: list[object] = []
        hooks = [layer.register_forward_hook(lambda _, __, out: self.kept.append(out)) for layer in self.layers]
        try:
            self.trainer = self({})  # [n]
        finally:
            for h in hooks:
                h.remove()

    def __call__(self, weights: dict[str, torch.Tensor], from_layer: int = 0) -> torch.Tensor:
        skipped = self.layers[:from_layer] if len(self.kept) == len(self.layers) else []
        for layer, out in zip(skipped, self.kept):
            layer.forward = lambda *_, _out=out, **__: _out
        try:
            logits = self.padded.logits(self.sub.model, weights)  # [n, V]
        finally:
            for layer in skipped:
                del layer.forward
        # the state's processors and shift on the screened rows (a prefix: the same row indices)
        return dataclasses.replace(self.state, logits=logits, tokens=self.sub.tokens, owner=self.sub.owner).logprobs()


@register_cause("quantized_layers")
def quantized_layers(ctx: Context, state: State) -> Fit | None:
    """Screen each scheme within reach (``REACH_MARGIN``) on each layer group; the best is what the engine
    served quantized."""
    groups = layer_groups(ctx.model)
    if not groups:
        return None
    sub = _screen_context(ctx)
    screened = _Screen(sub, state)
    trainer = screened.trainer  # [n]
    g = float((sub.engine - trainer).abs().mean())
    tried: dict[tuple[str, str], float] = {}

    def screen(fmt: str, among: list[str], rounded: dict[str, torch.Tensor]) -> None:
        for group in among:
            first = int(group.removeprefix("layer ")) if group.startswith("layer ") else 0
            lp = screened({n: rounded[n] for n in groups[group] if n in rounded}, from_layer=first)
            tried[fmt, group] = float((sub.engine - lp).abs().mean())

    for fmt in SCHEMES:
        rounded = quantized(ctx.model, groups["all"], fmt)  # each matrix once
        lp = screened(rounded)  # [n]
        if float((lp - trainer).abs().mean()) * REACH_MARGIN >= (1 - ACCEPT) * g:
            tried[fmt, "all"] = float((sub.engine - lp).abs().mean())
            screen(fmt, [c for c in COARSE if c in groups and c != "all"], rounded)
    if not tried:
        return None
    fmt, group = min(tried, key=tried.__getitem__)
    if tried[fmt, group] > EXACT * g:  # no layer group reproduces the engine: one layer alone?
        layers = [c for c in groups if c not in COARSE]
        screen(fmt, layers, quantized(ctx.model, dict.fromkeys(n for c in layers for n in groups[c]), fmt))
        fmt, group = min(tried, key=tried.__getitem__)
    names, key = groups[group], f"quantized:{fmt}:{group}"

    def apply(c: Context, s: State) -> State:
        load = lambda: served(c.model, quantized(c.model, names, fmt))  # noqa: E731
        return s.with_logits(c.rescore(key, [r.prompt_ids for r in c.records], load=load))

    ranked = sorted(tried, key=tried.__getitem__)[:3]
    fix = (f"the engine served {group} with {fmt} weights, which the trainer keeps in full precision: check the "
           "checkpoint's quantization config (modules_to_not_convert / ignore patterns, vLLM PR #44628), or "
           f"quantize the trainer alike (minirl Knobs(weights={fmt!r})) and correct with TIS")
    return Fit("quantized_layers", f"{fmt} on {group}", "scheme", apply, fix,
               {"screened_gap": {f"{f} on {grp}": tried[f, grp] for f, grp in ranked}})


def _to(x: object, dtype: torch.dtype) -> object:
    """``x`` with its floating tensors (also inside tuples, lists and dicts) cast to ``dtype``."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, dtype) for k, v in x.items()}
    return x


def in_dtype(modules: Iterable[nn.Module | None], dtype: torch.dtype) -> None:
    """Run each module in ``dtype`` (weights and inputs cast, outputs back to float32), in place: an engine
    that computes that part in ``dtype`` and hands float32 on. Each module gets cast copies of its own
    parameters, not ``m.to(dtype)``: that casts a tied parameter where it is shared too (smollm2's and
    Gemma 3's lm_head is the embedding table, which would then be rounded and, on Gemma 3, feed bf16
    into fp32 layers)."""
    for m in (m for m in modules if m is not None):
        for sub in m.modules():
            for name, p in list(sub.named_parameters(recurse=False)):
                if p.is_floating_point():
                    setattr(sub, name, nn.Parameter(p.detach().to(dtype), requires_grad=False))
            for name, b in list(sub.named_buffers(recurse=False)):
                if b.is_floating_point():
                    sub.register_buffer(name, b.to(dtype), persistent=name not in sub._non_persistent_buffers_set)
        m.register_forward_pre_hook(lambda _, args, kwargs: (_to(args, dtype), _to(kwargs, dtype)), with_kwargs=True)
        m.register_forward_hook(lambda _, args, out: _to(out, torch.float32))


def _bf16_weights(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))


def _gemm(m: nn.Module) -> bool:
    """A linear layer, or MoE experts (stacked GEMM weights [E, out, in], no ``nn.Linear``)."""
    return isinstance(m, nn.Linear) or isinstance(getattr(m, "gate_up_proj", None), nn.Parameter)


def _part(pick: Callable[[object], Iterable[nn.Module | None]], dtype: torch.dtype = torch.bfloat16):
    def apply(model: nn.Module) -> None:
        from aligntools.adapters.roles import find_roles

        in_dtype(pick(find_roles(model, getattr(model, "config", None))), dtype)

    return apply


KNOBS: dict[str, Callable[[nn.Module], object]] = {
    "bf16": lambda m: m.to(torch.bfloat16),  # transformers in bf16 = minirl Knobs.hf_exact() at dtype bfloat16
    "fp16": lambda m: m.to(torch.float16),
    "bf16 weights": _bf16_weights,  # a bf16 checkpoint, fp32 compute = Knobs(weight_dtype="bfloat16"), fp32
    "bf16 matmuls": _part(lambda r: [*(m for lr in r.layers for m in lr.layer.modules() if _gemm(m)), r.lm_head]),
    "bf16 lm_head": _part(lambda r: [r.lm_head]),  # = Knobs(lm_head_dtype="bfloat16"), fp32 activations
    "bf16 attention": _part(lambda r: [lr.attn for lr in r.layers]),
    "bf16 mlp": _part(lambda r: [lr.mlp for lr in r.layers]),
    "bf16 norms": _part(lambda r: [*(n for lr in r.layers for n in (lr.attn_norm, lr.mlp_norm)), r.final_norm]),
}
"""Fingerprint candidates: name -> what it does to a copy of the trainer's fp32 model, in place. Emulated by
casting parts of the HF model (any architecture transformers runs), not by minirl's engine (which runs the
architectures it implements); the comments name the minirl knob each one matches."""


def padded_logits(ctx: Context, model: nn.Module) -> torch.Tensor:
    """Logits [N, V] of ``ctx``'s recorded tokens under ``model``, in right-padded batches (``_Padded.groups``):
    the fingerprint scores the trainer and every candidate this one way, so their differences hold no
    batching noise."""
    return torch.cat([b.logits(model) for b in _Padded.groups(ctx.records, ctx.vocab)])


def moved(ctx: Context, state: State, progress: bool = False) -> dict[str, torch.Tensor]:
    """Per candidate of ``KNOBS``: how far it moves each recorded token's modelled logprob, [N] float64
    (candidate minus ``state``), with ``state``'s processors and shift kept. ``state`` holds the trainer's
    logits as ``padded_logits`` scores them, as each candidate is scored."""
    from tqdm.auto import tqdm

    base = state.logprobs()
    out = {}
    for name, apply in tqdm(KNOBS.items(), desc="fingerprint", unit="candidate", disable=not progress):
        engine = copy.deepcopy(ctx.model)
        apply(engine)
        out[name] = state.with_logits(padded_logits(ctx, engine)).logprobs() - base
    return out


def shares(ctx: Context, state: State, deltas: dict[str, torch.Tensor] | None = None) -> list[tuple[str, float]]:
    """(candidate, share of the gap of ``state`` (the trainer's logits as ``padded_logits`` scores them) it
    removes token by token, clipped at 0; 0 where it overflows), best first; ``deltas``: ``moved(ctx,
    state)`` when already computed."""
    deltas = moved(ctx, state) if deltas is None else deltas
    base, g0 = state.logprobs(), gap(ctx, state)
    out = [(name, max(0.0, 1 - float((ctx.engine - base - d).abs().mean()) / g0) if g0 > 0 else 0.0)
           for name, d in deltas.items()]
    return sorted(out, key=lambda x: -x[1])


def fingerprint(records: Iterable[Record] | str | os.PathLike, model: str | os.PathLike | nn.Module,
                tokens: int = FINGERPRINT_TOKENS) -> list[tuple[str, float]]:
    """Which engine precision choice reproduces ``records``' logprobs best: (candidate of ``KNOBS``, share of
    the trainer-engine gap it removes), best first, on the first records holding ``tokens`` tokens."""
    from aligntools.audit.score import load_model

    recs = read(records) if isinstance(records, (str, os.PathLike)) else list(records)
    trainer = load_model(model)
    ctx, _ = Context.of(recs, trainer, trainer.get_output_embeddings().weight.shape[0]).head(tokens)
    return shares(ctx, State(padded_logits(ctx, trainer), ctx.tokens, ctx.owner))


def numeric_detail(ctx: Context, state: State, progress: bool = False) -> dict:
    """What the audit adds to ``numeric``'s ``detail`` (``state``: the causes found, applied), on the first
    records holding ``FINGERPRINT_TOKENS``: ``fingerprint``, the ``shares`` with ``state``'s processors and
    shift; ``by_size`` (``aligntools.audit.by_size``), each candidate's own gap beside the recorded one; and
    ``replay``, the first record through the minirl engine of the candidate that reproduces the engine
    (share >= ``REPRODUCES``), else of the closest in size that minirl computes (None when neither)."""
    sub, _ = ctx.head(FINGERPRINT_TOKENS)
    st = dataclasses.replace(state, logits=padded_logits(sub, ctx.model), tokens=sub.tokens, owner=sub.owner)
    deltas = moved(sub, st, progress)
    found = shares(sub, st, deltas)
    sized = by_size(sub.engine - st.logprobs(), deltas, sub.owner, sub.position)
    consistent = [c["candidate"] for c in sized["candidates"] if c["reading"] == "consistent"]
    best = found[0][0] if found[0][1] >= REPRODUCES else next((c for c in consistent if c in ENGINES), None)
    return {"fingerprint": found, "by_size": sized, "replay": replay(ctx.records[0], ctx.model, best) if best else None}


ENGINES: dict[str, tuple[str, dict]] = {
    "bf16": ("bfloat16", {}),
    "fp16": ("float16", {}),
    "bf16 weights": ("float32", {"weight_dtype": "bfloat16"}),
    "bf16 lm_head": ("float32", {"lm_head_dtype": "bfloat16"}),
    "bf16 norms": ("float32", {"rmsnorm": "bf16_compute"}),
}
"""Fingerprint candidates minirl's engine computes: (activation dtype, changes to ``Knobs.hf_exact()``,
which is transformers bit for bit in any dtype). The others (bf16 matmuls, attention, mlp) have no knob."""


def trainer_limits() -> Tolerance:
    """Every site and op held to float32's limits, the trainer's: the replay and its drill ask where the
    engine's numerics part from the trainer's, not whether they stay within the engine dtype's allowance."""
    from aligntools.analyzer.tolerance import DTYPE_RULES, Tolerance

    return Tolerance(dtypes=dict.fromkeys(DTYPE_RULES, DTYPE_RULES["float32"]))


def replay(record: Record, model: nn.Module, candidate: str) -> dict | None:
    """Replay ``record``'s prompt and first ``REPLAY_TOKENS`` through the trainer and through the minirl
    engine computing as ``candidate``, site by site (``aligntools.capture``, ``compare`` with every site held
    to float32's limits, the trainer's): where that engine's numerics part from the trainer's. ``engine`` is its spec as
    ``mlab check --infer`` and ``aligntools.drill`` take it; ``drill``, the site ``mlab audit --drill``
    opens (``drilldown.gate.target_in``: the first divergence is often a norm or the logits, which hold no
    ops to drill) and why that one. None for a candidate no knob setting matches; ``error`` when minirl
    cannot run the model (an architecture it does not implement)."""
    from aligntools.analyzer.comparison import compare
    from aligntools.drilldown.gate import target_in
    from aligntools.tracker.tracker import capture
    from minirl import Engine, EngineSpec

    if candidate not in ENGINES:
        return None
    dtype, changes = ENGINES[candidate]
    spec = EngineSpec.parse(",".join(["minirl:hf_exact", *(f"{k}={v}" for k, v in changes.items()), f"dtype={dtype}"]))
    try:
        engine = Engine(model.config.to_dict(), model.state_dict(), dtype=dtype, knobs=spec.knobs())
    except ValueError as e:
        return {"candidate": candidate, "engine": str(spec), "error": str(e)}
    ids = torch.tensor([[*record.prompt_ids, *record.completion_ids[:REPLAY_TOKENS - 1]]])  # [1, S]
    cmp = compare(capture(model, ids), capture(engine, ids), labels=("trainer", "engine"), tolerance=trainer_limits())
    first, drill = cmp.first_divergence, target_in(cmp)
    return {"candidate": candidate, "engine": str(spec), "first_divergence": None if first is None else first.site,
            "why": None if first is None else str(first), "failures": len(cmp.failures),
            "drill": None if drill is None else {"site": drill.site, "why": drill.why}}
