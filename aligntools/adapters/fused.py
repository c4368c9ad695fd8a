"""Inference-engine module trees (vLLM, SGLang) -> sites, undoing their fusions at capture time.

vLLM and SGLang share one module layout and one set of conventions, which is why one piece
serves both (their adapters only add how the token layout and the model are reached):
  * tensors are flat ``[num_tokens, ...]`` over all requests of a step (no batch dim);
  * ``qkv_proj`` is one GEMM: q, k, v are split by ``(q_size, kv_size, kv_size)``; q/k after
    RoPE are the outputs of ``self_attn.rotary_emb(positions, q, k) -> (q, k)``. vLLM caches
    one rotary module per RoPE config, so every layer calls the *same* module: its hook
    emits for the layer whose attention is running (a pre-hook on each attention says
    which), else every layer's q/k would be overwritten by the last layer's;
  * linear layers return ``(out, bias)``; the MoE ``gate`` returns ``(router_logits, None)``
    and the top-k happens inside the fused-MoE kernel (recomputed here the way the kernel
    routes: fp32 softmax, top-k, renormalised when the config says so);
  * ``RMSNorm(x, residual)`` is fused add+norm, returns ``(normed, x + residual)`` and writes
    both into its input buffers *in place*; a decoder layer returns the pair
    ``(delta, residual)`` and the next layer's norm adds them. So ``resid_mid`` is the
    residual returned by the MLP's pre-norm, ``resid_post`` is rebuilt as
    ``delta + residual`` from the layer's output, and every value is copied when its hook
    fires (the Recorder copies), before the next fused op overwrites the buffer.
The family's entry (``minirl.families``) says where a model departs from that: its embedding
scale (applied to ``embed_tokens``' output, so ``embed`` is what the first layer adds to),
layers that return ``(hidden + residual, residual)`` (Cohere, StableLM: the first output
already is ``resid_post``) and which norm is the MLP's (``roles``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

import kernels
from aligntools.adapters.base import Adapter
from aligntools.adapters.hf import ROPE_SYMBOL, RopeTap, rope_module, unpatch_rope
from aligntools.adapters.roles import ModelRoles, find_roles
from aligntools.tracker.provenance import model_hash
from aligntools.tracker.recorder import DERIVED, Recorder
from aligntools.sites import sort_sites
from aligntools.tracker.token_meta import TokenMeta

Reader = Callable[[tuple, object], dict[str, torch.Tensor]]  # (inputs, output) -> {kind: value}


def first(out: object) -> torch.Tensor:
    """The tensor of a module output that may be ``(out, bias)`` / ``(normed, residual)``."""
    return out[0] if isinstance(out, (tuple, list)) else out


def rebuild_residual(layer_output: object) -> torch.Tensor:
    """The residual stream after a layer from the engines' ``(delta, residual)`` return."""
    if isinstance(layer_output, (tuple, list)) and len(layer_output) == 2 and layer_output[1] is not None:
        delta, residual = layer_output
        return delta + residual
    return first(layer_output)


def norm_outputs(out: object, args: tuple = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A norm's return -> (normed, residual stream): the residual after the fused add of
    ``RMSNorm(x, residual)``, else the norm's own input when ``args`` is given (an unfused
    norm, e.g. StableLM's ``LayerNorm``, is called on the residual stream itself), else None."""
    if isinstance(out, (tuple, list)):
        return out[0], out[1]
    return out, (args[0] if args and len(args) == 1 and isinstance(args[0], torch.Tensor) else None)


def scaled_embed(value: torch.Tensor, scale: float | None, attr: str | None) -> torch.Tensor:
    """The embedding the first layer adds to: the engines' embedding modules return it unscaled
    and their forward multiplies after. √hidden (Gemma) is rounded to the model dtype first, as
    vLLM's ``normalizer`` buffer and transformers' ``embed_scale`` are; a config multiplier
    (Granite) multiplies as a Python float, as both models do."""
    if scale is None:
        return value
    return value * (torch.tensor(scale, dtype=value.dtype) if attr == "sqrt_hidden" else scale)


Rows = tuple[torch.Tensor | None, TokenMeta]  # (row indices of a flat tensor or None for all, their meta)


def flat_meta(input_ids: torch.Tensor, positions: torch.Tensor, query_start_loc: torch.Tensor,
              requests: list[int], steps: list[int]) -> list[Rows]:
    """Token rows of a flat step: request ``requests[i]`` owns rows
    ``query_start_loc[i]:query_start_loc[i+1]`` and is at step ``steps[i]``.

    One entry per distinct step: continuous batching mixes the prefill of new requests
    (step 0) with decode steps of others in one forward.
    """
    starts = query_start_loc.tolist()
    req = torch.empty(len(input_ids), dtype=torch.long)
    step = torch.empty(len(input_ids), dtype=torch.long)
    for i, (lo, hi) in enumerate(zip(starts[:-1], starts[1:])):
        req[lo:hi], step[lo:hi] = requests[i], steps[i]
    out: list[Rows] = []
    for s in sorted(set(steps)):
        idx = torch.nonzero(step == s)[:, 0]
        meta = TokenMeta(request=req[idx], position=positions.cpu().long()[idx],
                         token_id=input_ids.cpu().long()[idx], step=int(s))
        out.append((None if len(idx) == len(input_ids) else idx, meta))
    return out


@dataclass(frozen=True)
class HookPlan:
    """One hooked module: its path, how to read it, and the sites it yields."""

    path: str
    module: nn.Module
    read: Reader
    kinds: tuple[str, ...]
    layer: int | None


def hook_plan(model: nn.Module, roles: ModelRoles, config: object | None) -> list[HookPlan]:
    """Which module feeds which sites, for a vLLM/SGLang-style tree (also a debugging map);
    ``config`` (the model's transformers config) names its family (``minirl.families``)."""
    from minirl.families import embed_scale, family  # minirl only once a model is hooked

    fam, scale = family(config), embed_scale(config)
    top_k = int(getattr(config, "num_experts_per_tok", 2))
    renormalize = bool(getattr(config, "norm_topk_prob", True))
    paths = {id(m): p for p, m in model.named_modules()}
    plan: list[HookPlan] = []
    resid_post = (lambda a, o: {"resid_post": first(o)}) if fam.vllm_layer_returns_sum else (
        lambda a, o: {"resid_post": rebuild_residual(o)})

    def add(module: nn.Module | None, read: Reader, kinds: tuple[str, ...], layer: int | None = None) -> None:
        if module is not None:
            plan.append(HookPlan(paths[id(module)], module, read, kinds, layer))

    add(roles.embed, lambda a, o: {"embed": scaled_embed(first(o), scale, fam.embed_scale_attr)}, ("embed",))
    for lr in roles.layers:
        i, attn = lr.index, lr.attn
        add(lr.attn_norm, lambda a, o: {"attn_norm": norm_outputs(o)[0]}, ("attn_norm",), i)
        add(getattr(attn, "rotary_emb", None), lambda a, o: {"q": o[0], "k": o[1]}, ("q", "k"), i)
        if lr.fused_qkv is not None:
            add(lr.fused_qkv, lambda a, o, lr=lr: {"v": lr.fused_v(first(o))}, ("v",), i)
        add(attn, lambda a, o: {"attn_out": first(o)}, ("attn_out",), i)
        add(lr.mlp_norm, lambda a, o: dict(zip(("mlp_norm", "resid_mid"), norm_outputs(o, a))),
            ("resid_mid", "mlp_norm"), i)
        if lr.router is not None:
            add(lr.router, lambda a, o: _routing(first(o), top_k, renormalize),
                ("router_logits", "topk_ids", "topk_weights"), i)
        add(lr.mlp, lambda a, o: {"mlp_out": first(o)}, ("mlp_out",), i)
        add(lr.layer, resid_post, ("resid_post",), i)
    add(roles.final_norm, lambda a, o: {"final_norm": norm_outputs(o)[0]}, ("final_norm",))
    add(_child(model, "logits_processor"), lambda a, o: {"logits": first(o)}, ("logits",))
    return plan


def _routing(logits: torch.Tensor, k: int, renormalize: bool) -> dict[str, torch.Tensor]:
    """The choice a softmax top-k router makes from its logits [T, E] (vLLM/SGLang ``fused_topk``
    = transformers' Mixtral / Qwen3-MoE / OLMoE routing: softmax, ``torch.topk``, optional
    renormalisation), for engines whose router module returns only logits."""
    ids, weights = kernels.get("router_topk", "torch")(logits, k, renormalize=renormalize)  # [T, k] each
    return {"router_logits": logits, "topk_ids": ids, "topk_weights": weights}


def _child(model: nn.Module, name: str) -> nn.Module | None:
    found = getattr(model, name, None)
    return found if isinstance(found, nn.Module) else None


class FusedModuleAdapter(Adapter):
    """Hooks a vLLM/SGLang-style model. ``layout(args, kwargs) -> list[Rows]`` gives the token
    rows of each forward of ``model`` (see ``flat_meta``); subclasses say where the layout
    comes from (their ``_layout`` method, when ``layout`` is None) and how the engine is
    reached. A method, not ``layout=self._layout``: an adapter holding its own bound method
    is a reference cycle, which keeps the capture it recorded alive until Python's full
    garbage collection."""

    engine = "module"

    def __init__(self, model: nn.Module, config: object,
                 layout: Callable[[tuple, dict], list[Rows]] | None = None) -> None:
        roles = find_roles(model, config)
        if roles is None:
            raise ValueError(f"{type(model).__qualname__}: no decoder layers with qkv_proj/o_proj found")
        self.model, self.config, self.roles, self.layout = model, config, roles, layout
        self.plan = hook_plan(model, roles, config)
        self._handles: list = []
        self._patches: list[tuple[object, RopeTap]] = []
        self._rows: list[Rows] | None = None
        self._layer: int | None = None  # the layer whose attention runs (for shared modules)
        # vLLM's Transformers backend runs transformers' own attention: RoPE is its modeling
        # module's function, tapped as the HF adapter does, not a ``rotary_emb`` module
        self.rope_layers = [lr.index for lr in roles.layers
                            if getattr(lr.attn, "rotary_emb", None) is None and rope_module(lr.attn) is not None]

    def available_sites(self) -> list[str]:
        sites = [k if p.layer is None else f"L{p.layer}.{k}" for p in self.plan for k in p.kinds]
        sites += [f"L{i}.{k}" for i in self.rope_layers for k in ("q", "k")]
        return sort_sites(sites + (list(DERIVED) if "logits" in sites else []))

    def attach(self, recorder: Recorder) -> None:
        need = recorder.needed
        self._recorder = recorder
        self._handles.append(self.model.register_forward_pre_hook(self._begin, with_kwargs=True))
        for lr in self.roles.layers:
            self._handles.append(lr.attn.register_forward_pre_hook(lambda m, a, i=lr.index: self._enter(i)))
        owners: dict[int, set] = {}
        for p in self.plan:
            owners.setdefault(id(p.module), set()).add(p.layer)
        for p in self.plan:
            names = {k: k if p.layer is None else f"L{p.layer}.{k}" for k in p.kinds}
            shared = len(owners[id(p.module)]) > 1
            if need & set(names.values()):
                self._handles.append(p.module.register_forward_hook(
                    lambda m, a, o, p=p, names=names, shared=shared: None if shared and self._layer != p.layer
                    else self._emit(recorder, need, names, p.read(a, o))))
        for i in self.rope_layers:
            mod = rope_module(self.roles.layers[i].attn)
            if need & {f"L{i}.q", f"L{i}.k"} and not any(m is mod for m, _ in self._patches):
                tap = RopeTap(getattr(mod, ROPE_SYMBOL), self._emit_rope)
                setattr(mod, ROPE_SYMBOL, tap)
                self._patches.append((mod, tap))

    def _emit_rope(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """q/k after transformers' RoPE, ``[1, heads, T, D]`` -> ``[T, heads * D]``."""
        if self._layer in self.rope_layers:
            names = {"q": f"L{self._layer}.q", "k": f"L{self._layer}.k"}
            self._emit(self._recorder, self._recorder.needed, names,
                       {kind: x.transpose(-3, -2).flatten(-2).flatten(0, -2) for kind, x in (("q", q), ("k", k))})

    def _enter(self, layer: int) -> None:
        self._layer = layer

    def _begin(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._recorder.forward_boundary()  # steps interleave inside a forward: flush between forwards
        self._rows = (self.layout or self._layout)(args, kwargs)

    def _layout(self, args: tuple, kwargs: dict) -> list[Rows]:
        raise NotImplementedError(f"{type(self).__name__}: give layout= or define _layout")

    def _emit(self, rec: Recorder, need: set[str], names: dict[str, str], values: dict[str, torch.Tensor]) -> None:
        if self._rows is None:
            return
        for kind, value in values.items():
            if names[kind] not in need or value is None:
                continue
            if value.dim() == 3 and value.shape[0] == 1:  # a transformers module inside vLLM: [1, T, ...]
                value = value[0]
            rows = self._rows if value.shape[0] == self._n_rows() else self._last_rows(value.shape[0])
            for idx, meta in rows:
                rec.emit(names[kind], value if idx is None else value[idx.to(value.device)], meta)

    def _n_rows(self) -> int:
        return sum(len(meta.request) for _, meta in self._rows)

    def _columns(self) -> torch.Tensor:
        """[4, n_rows]: request, position, token, step of each flat row of this forward."""
        cols = torch.empty(4, self._n_rows(), dtype=torch.long)
        for idx, meta in self._rows:
            at = slice(None) if idx is None else idx
            cols[0, at], cols[1, at], cols[2, at], cols[3, at] = (meta.request, meta.position, meta.token_id,
                                                                  meta.step)
        return cols

    def _last_rows(self, n: int) -> list[Rows]:
        """Rows of a tensor computed only at each request's last token (engines compute
        logits for the sampled positions only); [] when ``n`` is not the request count."""
        req = self._columns()[0]
        last = torch.nonzero(torch.cat([req[1:] != req[:-1], torch.tensor([True])]))[:, 0]
        return self.rows_at(last) if len(last) == n else []

    def rows_at(self, flat: torch.Tensor) -> list[Rows]:
        """Rows for a tensor whose i-th row is flat row ``flat[i]`` of this forward."""
        req, pos, tok, step = self._columns()[:, flat]
        return [(torch.nonzero(step == s)[:, 0], TokenMeta(req[step == s], pos[step == s], tok[step == s], int(s)))
                for s in sorted(set(step.tolist()))]

    def emit_rows(self, site: str, value: torch.Tensor, rows: list[Rows]) -> None:
        """Emit ``value`` [n, ...] at ``rows`` (from ``rows_at``) if the capture needs ``site``."""
        if site in self._recorder.needed:
            for idx, meta in rows:
                self._recorder.emit(site, value if idx is None else value[idx.to(value.device)], meta)

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, tap in reversed(self._patches):
            unpatch_rope(mod, tap)
        self._patches.clear()
        self._rows = self._layer = self._recorder = None  # a kept adapter holds no capture

    def run(self, input_ids: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} captures the engine's own calls; run it under the Tracker")

    def describe(self) -> dict:
        p = next((p for p in self.model.parameters() if p.is_floating_point()), None)
        dtype = str(p.dtype).removeprefix("torch.") if p is not None else "unknown"
        path = getattr(self.config, "_name_or_path", None)
        return {"dtype": dtype, "knobs": {}, "model_hash": model_hash(self.model, path or None)}
