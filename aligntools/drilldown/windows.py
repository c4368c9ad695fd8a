"""Run one engine forward and record the ops of one site's module, on each kind of engine.

Why the whole forward and not the module alone: the module then gets exactly the input the
engine feeds it (the captured input of the site, with the masks, position tables and
caches the engine builds around it), with no engine internals rebuilt here. The recorder
is opened where the module starts and closed where it ends:

    transformers   forward pre-/post-hooks on the layer's attention or MLP module
                   (found by role, ``aligntools.adapters.roles``)
    minirl         the engine's taps: the input site (``L{i}.attn_norm`` / ``L{i}.mlp_norm``)
                   opens it, the module's output site (``attn_out`` / ``mlp_out``) closes it
"""

from __future__ import annotations

import torch

from aligntools.adapters.roles import find_roles
from aligntools.drilldown.record import OpRecorder
from aligntools.sites import parse

MODULES = {
    # site kind -> (module, its input site, its output site)
    **{k: ("attention", "attn_norm", "attn_out") for k in ("q", "k", "v", "attn_out")},
    **{k: ("mlp", "mlp_norm", "mlp_out") for k in ("router_logits", "topk_ids", "topk_weights", "mlp_out")},
}
"""Sites a drill can open: the layer module that computes them."""


def module_of(site: str) -> tuple[int, str, str, str]:
    """``L2.q`` -> (2, "attention", "attn_norm", "attn_out"); other sites are refused."""
    s = parse(site)
    if s.layer is None or s.kind not in MODULES:
        raise ValueError(f"drill opens a layer's attention or MLP/MoE module: site must be L{{i}}.one of "
                         f"{', '.join(MODULES)}; got {site!r} (norms, lm_head: aligntools.replay)")
    return (s.layer, *MODULES[s.kind])


def record_hf(model: torch.nn.Module, ids: torch.Tensor, site: str) -> OpRecorder:
    """The ops of ``site``'s module in a transformers forward over ``ids`` [1, S]."""
    layer, module, _, _ = module_of(site)
    roles = find_roles(model, getattr(model, "config", None))
    if roles is None or layer >= len(roles.layers):
        raise ValueError(f"{site}: the model has no decoder layer {layer}")
    lr = roles.layers[layer]
    target = lr.attn if module == "attention" else lr.mlp
    if target is None:
        raise ValueError(f"{site}: layer {layer} has no {module} module")
    rec = OpRecorder(ids.shape[1])
    pre = target.register_forward_pre_hook(
        lambda m, args, kwargs: rec.open(args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    post = target.register_forward_hook(lambda m, args, out: rec.close(out))
    try:
        with torch.no_grad(), rec:
            model(input_ids=ids, use_cache=False)
    finally:
        pre.remove()
        post.remove()
    return rec


def record_minirl(engine: object, ids: torch.Tensor, site: str) -> OpRecorder:
    """The ops of ``site``'s module in a minirl ``Engine.score`` over ``ids`` [1, S]."""
    layer, _, start, end = module_of(site)
    start, end = f"L{layer}.{start}", f"L{layer}.{end}"
    rec = OpRecorder(ids.shape[1])

    def tap(name: str, value: torch.Tensor, meta: object) -> None:
        if name == start:
            rec.open(value)
        elif name == end:
            rec.close(value)

    handle = engine.add_tap(tap)
    try:
        with rec:
            engine.score(ids.tolist())
    finally:
        handle.remove()
    return rec
