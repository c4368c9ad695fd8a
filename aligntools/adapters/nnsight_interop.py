"""nnsight interop: values saved in an nnsight trace become a ``Capture``.

Three ways in: pass the nnsight model itself as a Tracker target (its wrapped module is
hooked; captures also happen inside ``model.trace(...)``); convert a dict of values you
saved yourself with ``from_nnsight``; or let ``trace_sites`` save the module-mapped sites
through nnsight (the peer baseline of benchmarks/bench_tracker.py). nnsight is imported by
none of this: the model object is used through its envoy attributes only.

What nnsight cannot save here: ``q``/``k`` after RoPE (RoPE is a function, not a module, in
transformers), so ``trace_sites`` omits them; the Tracker has them.
"""

from __future__ import annotations

import json

import torch

from aligntools.adapters.roles import LayerRoles, find_roles
from aligntools.adapters.torch_layout import ForwardLayout
from aligntools.tracker.capture_dataset import Capture
from aligntools.tracker.store import MemoryStore
from aligntools.tracker.provenance import library_versions, model_hash
from aligntools.tracker.recorder import DERIVED, Recorder
from aligntools.sites import ROUTING_SITES, select, sort_sites

# per-layer (site kind, submodule attr path or "" for the layer, what to read), execution order
_LAYER_PLAN = (
    ("attn_norm", "attn_norm", "output"),
    ("v", "attn.v_proj", "output"),
    ("attn_out", "attn", "output0"),
    ("resid_mid", "mlp_norm", "input"),
    ("mlp_norm", "mlp_norm", "output"),
    ("routing", "router", "output"),
    ("mlp_out", "mlp", "output"),
    ("resid_post", "", "output"),
)


def from_nnsight(saved: dict[str, torch.Tensor], input_ids: torch.Tensor, *,
                 attention_mask: torch.Tensor | None = None, model: torch.nn.Module | None = None,
                 mode: str = "tensor", engine: str = "hf") -> Capture:
    """A Capture from values saved in one nnsight trace of ``input_ids`` [batch, seq].

    ``saved`` maps site names (``"L0.resid_post"``, ``"logits"``) or raw module paths to
    tensors shaped ``[batch, seq, ...]`` or ``[batch*seq, ...]``; padding (``attention_mask``)
    is dropped. ``logprobs``/``entropy`` are derived when ``logits`` is given. ``model``
    (optional) stamps its checkpoint hash and dtype.
    """
    values = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
    if len(values) != len(saved):
        bad = sorted(set(saved) - set(values))
        raise TypeError(f"from_nnsight takes tensors; these entries are not: {bad} (save output[0] of tuples)")
    layout = ForwardLayout(input_ids, None, attention_mask, None, past_len=0, step=0)
    sites = sort_sites(list(values) + (list(DERIVED) if "logits" in values else []))
    attrs = _attrs(values, model, engine)
    rec = Recorder(sites, mode, MemoryStore(attrs), flush_bytes=None, progress=False)
    rec.begin_call()
    for site in sort_sites(list(values)):
        mapped = layout.rows(values[site])
        if mapped is None:
            raise ValueError(f"{site}: shape {tuple(values[site].shape)} is not per token of the "
                             f"{layout.batch}x{layout.seq} input")
        rec.emit(site, *mapped)
    rec.finish(attrs, complete=True)
    return Capture(rec.dataset())


def trace_sites(nn_model: object, input_ids: torch.Tensor, sites: str | list[str] = "*") -> dict[str, torch.Tensor]:
    """Save the module-mapped sites of a transformers model through ``nn_model.trace``.

    Returns ``{site: tensor}`` ready for ``from_nnsight``. Modules are requested in execution
    order, as nnsight requires.
    """
    module = nn_model._module
    roles = find_roles(module, getattr(module, "config", None))
    if roles is None:
        raise ValueError(f"{type(module).__qualname__} has no recognisable decoder layers")
    plan = _plan(module, roles)
    wanted = set(select(sites, sort_sites([x for site, _, _ in plan for x in _expand(site)])))
    plan = [p for p in plan if wanted & set(_expand(p[0]))]
    proxies = {}
    with nn_model.trace(input_ids):
        for site, path, read in plan:
            envoy = _envoy(nn_model, path)
            value = envoy.input if read == "input" else envoy.output[0] if read == "output0" else envoy.output
            proxies[site] = value.save()
    out: dict[str, torch.Tensor] = {}
    for site, value in proxies.items():
        if site.endswith(".routing"):  # transformers routers return (logits, top-k weights, top-k ids)
            value = dict(zip(("router_logits", "topk_weights", "topk_ids"), value))
            out.update({x: value[x.rsplit(".", 1)[1]] for x in _expand(site) if x in wanted})
        else:
            out[site] = value
    return out


def _expand(site: str) -> list[str]:
    """A plan entry's sites: ``L0.routing`` stands for the three routing sites."""
    return [site.replace("routing", k) for k in ROUTING_SITES] if site.endswith(".routing") else [site]


def _plan(module: torch.nn.Module, roles) -> list[tuple[str, str, str]]:
    """(site, module path, read) in execution order for the parts this model has."""
    paths = {id(m): p for p, m in module.named_modules()}
    plan = [("embed", paths[id(roles.embed)], "output")] if roles.embed is not None else []
    for lr in roles.layers:
        for kind, attr, read in _LAYER_PLAN:
            part = _part(lr, attr)
            if part is not None:
                plan.append((f"L{lr.index}.{kind}", paths[id(part)], read))
    for site, part in (("final_norm", roles.final_norm), ("logits", roles.lm_head)):
        if part is not None:
            plan.append((site, paths[id(part)], "output"))
    return plan


def _part(lr: LayerRoles, attr: str) -> torch.nn.Module | None:
    if not attr:
        return lr.layer
    obj: object = lr
    for name in attr.split("."):
        obj = getattr(obj, name, None)
    return obj if isinstance(obj, torch.nn.Module) else None


def _envoy(nn_model: object, path: str) -> object:
    envoy = nn_model
    for part in path.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    return envoy


def _attrs(values: dict[str, torch.Tensor], model: torch.nn.Module | None, engine: str) -> dict:
    dtype = next((v.dtype for v in values.values() if v.is_floating_point()), torch.float32)
    path = getattr(model, "name_or_path", None) if model is not None else None
    return {"engine": engine, "dtype": str(dtype).removeprefix("torch."), "knobs": json.dumps({"source": "nnsight"}),
            "versions": json.dumps(library_versions()),
            "model_hash": model_hash(model, path or None) if model is not None else "unknown"}
