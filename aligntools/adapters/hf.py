"""transformers (and any role-structured ``nn.Module``) -> sites, through forward hooks.

How each site is read (pre-norm decoder layers: Llama, Qwen2/3, Qwen3-MoE, Mixtral, OLMoE; sandwich Gemma 2/3):
``attn_norm``/``mlp_norm``/``attn_out``/``mlp_out``/``resid_post``/``final_norm``/``logits``
are module outputs; ``resid_mid`` is the *input* of the post-attention norm (the residual
after attention, which transformers never names); ``v`` is the ``v_proj`` output (a fused
``qkv_proj``'s last columns in Phi-3, each head's last third of GPT-NeoX's ``query_key_value``). ``q``/``k``
after RoPE: RoPE is a function (``apply_rotary_pos_emb``) inside the attention forward,
not a module, so while attached the adapter swaps that symbol in the attention's modeling
module for a wrapper that returns the original's result unchanged and emits it (restored
on detach); an attention pre-hook tells the wrapper which layer is running. Routing: the
transformers 5 routers return ``(logits, topk_weights, topk_ids)``, read as computed;
a router that returns only logits is routed like transformers does (kernels' ``torch`` router_topk,
renormalised when ``config.norm_topk_prob`` says so, default True as Mixtral always does).
What a site means comes from the family's entry in ``minirl.families``: ``embed`` is what the
first layer adds to (Granite's ``embedding_multiplier`` is applied here; Gemma's embedding module
already returns it times √hidden), ``logits`` is what the model softmaxes (Granite's
``/ logits_scaling``, Cohere's ``* logit_scale`` and Gemma 2/3's soft-cap, which the model's
forward applies after ``lm_head``, are applied to ``lm_head``'s output the same way), and the
MLP's pre-norm is the one the family's block shape names (``roles``).
"""

from __future__ import annotations

import sys
import warnings
from typing import Callable

import torch
from torch import nn

import kernels
from aligntools.adapters.base import Adapter
from aligntools.adapters.beam_reorder import watch_reorders
from aligntools.adapters.roles import LayerRoles, ModelRoles
from aligntools.adapters.torch_layout import ForwardLayout, call_inputs
from aligntools.tracker.provenance import model_hash
from aligntools.tracker.recorder import DERIVED, Recorder
from aligntools.sites import sort_sites

ROPE_SYMBOL = "apply_rotary_pos_emb"


class HFAdapter(Adapter):
    """Hooks a transformers causal LM (or a module with the same roles)."""

    def __init__(self, model: nn.Module, roles: ModelRoles, engine: str = "hf") -> None:
        self.model, self.roles, self.engine = model, roles, engine
        self.config = getattr(model, "config", None)
        self._handles: list = []
        self._patches: list[tuple[object, Callable]] = []
        self._rec: Recorder | None = None
        self._layout: ForwardLayout | None = None
        self._step = 0
        self._attn_layer: int | None = None
        self._unrotated: dict[int, dict[str, torch.Tensor]] = {}  # layer -> pre-RoPE q/k (partial RoPE on a slice)
        self._warned: set[str] = set()
        self._borrow = False  # set at attach: may tensor mode keep this model's tensors by reference?

    # ---- sites --------------------------------------------------------------------------

    def _layer_sites(self, lr: LayerRoles) -> list[str]:
        kinds = []
        if lr.attn_norm is not None:
            kinds.append("attn_norm")
        if self._rope_module(lr) is not None:
            kinds += ["q", "k"]
        if lr.fused_qkv is not None or (hasattr(lr.attn, "v_proj") and not hasattr(lr.attn, "conv1d")):  # a short conv:
            kinds.append("v")                                                        # v_proj's is not the v used
        kinds.append("attn_out")
        if lr.mlp_norm is not None:
            kinds += ["resid_mid", "mlp_norm"]
        if lr.router is not None:
            kinds += ["router_logits", "topk_ids", "topk_weights"]
        if lr.mlp is not None:
            kinds.append("mlp_out")
        kinds.append("resid_post")
        return [f"L{lr.index}.{k}" for k in kinds]

    def available_sites(self) -> list[str]:
        r = self.roles
        sites = ["embed"] if r.embed is not None else []
        for lr in r.layers:
            sites += self._layer_sites(lr)
        if r.final_norm is not None:
            sites.append("final_norm")
        if r.lm_head is not None:
            sites += ["logits", *DERIVED]
        return sort_sites(sites)

    def _rope_module(self, lr: LayerRoles) -> object | None:
        return rope_module(lr.attn)

    # ---- hooks --------------------------------------------------------------------------

    def attach(self, recorder: Recorder) -> None:
        self._rec = recorder
        self._borrow = _library_code_only(self.model)
        need = recorder.needed
        on = self._handles.append
        on(self.model.register_forward_pre_hook(self._begin_forward, with_kwargs=True))
        on(self.model.register_forward_hook(self._end_forward))
        r = self.roles
        from minirl.families import embed_scale, family, logits_transform  # minirl only once a model is hooked

        if "embed" in need:
            scale = None if family(self.config).hf_embed_scaled else embed_scale(self.config)
            on(_out_hook(r.embed, self._emitter("embed") if scale is None
                         else lambda value: self._emit("embed", value * scale, owned=True)))
        for lr in r.layers:
            self._attach_layer(lr, {s.split(".", 1)[1] for s in need if s.startswith(f"L{lr.index}.")})
        if "final_norm" in need:
            on(_out_hook(r.final_norm, self._emitter("final_norm")))
        if "logits" in need:
            transform = logits_transform(self.config)
            on(_out_hook(r.lm_head, self._emitter("logits") if transform.identity
                         else lambda value: self._emit("logits", transform.apply(value), owned=True)))

    def _attach_layer(self, lr: LayerRoles, kinds: set[str]) -> None:
        on, i = self._handles.append, lr.index
        emitter = lambda kind: self._emitter(f"L{i}.{kind}")  # noqa: E731
        if "attn_norm" in kinds:
            on(_out_hook(lr.attn_norm, emitter("attn_norm")))
        if kinds & {"q", "k"}:
            self._patch_rope(lr)
            self._keep_unrotated(lr)
            on(lr.attn.register_forward_pre_hook(lambda m, a: setattr(self, "_attn_layer", i)))
            on(lr.attn.register_forward_hook(lambda m, a, o: setattr(self, "_attn_layer", None)))
        if "v" in kinds and lr.fused_qkv is not None:  # Phi-3, GPT-NeoX: v is part of one GEMM's output
            on(_out_hook(lr.fused_qkv, lambda value: self._emit(f"L{i}.v", lr.fused_v(value))))
        elif "v" in kinds:
            on(_out_hook(lr.attn.v_proj, emitter("v")))
        # sublayer outputs are copied, never borrowed: the decoder layer owns them, and library code
        # may accumulate into them after the hook (Falcon's parallel block: `mlp_output += attention_output`)
        sublayer = lambda kind: lambda value: self._emit(f"L{i}.{kind}", value, borrow=False)  # noqa: E731
        if "attn_out" in kinds:
            on(_out_hook(lr.attn, sublayer("attn_out")))
        if "resid_mid" in kinds:
            on(lr.mlp_norm.register_forward_pre_hook(lambda m, args: self._emit(f"L{i}.resid_mid", args[0])))
        if "mlp_norm" in kinds:
            on(_out_hook(lr.mlp_norm, emitter("mlp_norm")))
        if kinds & {"router_logits", "topk_ids", "topk_weights"}:
            on(lr.router.register_forward_hook(lambda m, a, out: self._emit_routing(i, out)))
        if "mlp_out" in kinds:
            on(_out_hook(lr.mlp, sublayer("mlp_out")))
        if "resid_post" in kinds:
            on(_out_hook(lr.layer, emitter("resid_post")))

    def _patch_rope(self, lr: LayerRoles) -> None:
        mod = self._rope_module(lr)
        if any(m is mod for m, _ in self._patches):
            return
        tap = RopeTap(getattr(mod, ROPE_SYMBOL), self._emit_rope)
        setattr(mod, ROPE_SYMBOL, tap)
        self._patches.append((mod, tap))

    def _keep_unrotated(self, lr: LayerRoles) -> None:
        """Partial RoPE applied to a slice (StableLM: ``apply_rotary_pos_emb(q[..., :rotary_ndims], ...)``,
        the rest concatenated after): the tap sees only the rotated dims, so the pre-RoPE q/k
        (after a per-head q/k norm where there is one) are kept per layer for the tail."""
        attn, i = lr.attn, lr.index
        rot = getattr(attn, "rotary_ndims", None)
        if rot is None or not hasattr(attn, "q_proj") or rot >= attn.head_dim:  # GPT-NeoX: its RoPE function
            return                                                              # slices and concatenates itself
        for kind in ("q", "k"):
            norm = getattr(attn, f"{kind}_layernorm", None)
            source = norm if norm is not None else getattr(attn, f"{kind}_proj")
            self._handles.append(source.register_forward_hook(
                lambda m, a, out, kind=kind: self._unrotated.setdefault(i, {}).__setitem__(kind, out)))

    def _emit_rope(self, q_out: torch.Tensor, k_out: torch.Tensor) -> None:
        layer = self._attn_layer
        if layer is None:
            return
        tails = self._unrotated.pop(layer, None)
        if tails is not None:  # [B, S, heads(*D)] -> [B, heads, S, D], its unrotated dims after the rotated ones
            b, heads, s, rot = q_out.shape
            whole = {kind: t.reshape(b, s, -1, self.roles.layers[layer].attn.head_dim).transpose(1, 2)
                     for kind, t in tails.items()}
            q_out, k_out = (torch.cat([out, whole[kind][..., rot:]], dim=-1) for kind, out in (("q", q_out), ("k", k_out)))
        for kind, out in (("q", q_out), ("k", k_out)):
            # [B, heads, S, D] -> [B, S, heads*D]: a copy (ours to keep) unless S or heads is 1
            rows = out.transpose(1, 2).flatten(2)
            owned = rows.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
            self._emit(f"L{layer}.{kind}", rows, owned=owned)

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, wrapper in reversed(self._patches):
            unpatch_rope(mod, wrapper)
        self._patches.clear()
        self._layout = self._rec = None  # a kept adapter holds no capture

    def _begin_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        inp = call_inputs(args, kwargs)
        if inp["past_len"] == 0:
            self._rec.begin_call()
            self._step = 0
        else:
            self._step += 1
        if "logprobs" in self._rec.sites and kwargs.get("past_key_values") is not None:
            watch_reorders(kwargs["past_key_values"], self._on_beam_reorder)
        self._layout = ForwardLayout(inp["input_ids"], inp["embeds"], inp["attention_mask"],
                                     inp["position_ids"], inp["past_len"], self._step)

    def _end_forward(self, module: nn.Module, args: tuple, output: object) -> None:
        """The forward's one host sync, when it ran on a device (``Recorder.end_forward``)."""
        self._layout = None
        self._rec.end_forward()

    def _on_beam_reorder(self) -> None:
        """Beam search moved hypotheses between rows: say so once, on the capture too."""
        if not self._handles:  # a cache still watched after this Tracker ended
            return
        note = ("beam search reordered the batch rows between steps: the derived logprobs pair a row's logits "
                "with the next token of whichever hypothesis the row holds next, so they are not meaningful "
                "(capture with num_beams=1, or leave logprobs out and pair the logits yourself)")
        if note not in self._rec.notes:
            self._rec.notes.append(note)
            warnings.warn(note, stacklevel=2)

    def _emitter(self, site: str) -> Callable[[torch.Tensor], None]:
        return lambda value: self._emit(site, value)

    def _emit(self, site: str, value: object, owned: bool = False, borrow: bool = True) -> None:
        if self._layout is None or not isinstance(value, torch.Tensor):
            return
        if site not in self._rec.needed:
            return
        mapped = self._layout.rows(value)
        if mapped is None:
            self._warn_once(site, f"{site}: output shape {tuple(value.shape)} does not map onto the "
                                  f"{self._layout.batch}x{self._layout.seq} tokens; not captured")
            return
        self._rec.emit(site, *mapped, owned=owned, borrow=borrow and self._borrow)

    def _emit_routing(self, layer: int, out: object) -> None:
        if isinstance(out, (tuple, list)) and len(out) >= 3 and not out[2].is_floating_point():
            logits, weights, ids = out[0], out[1], out[2]
            if weights.shape[-1] != ids.shape[-1]:  # dense [N, E] scores: read the chosen ones
                weights = weights.gather(-1, ids)
        else:
            logits = out[0] if isinstance(out, (tuple, list)) else out
            ids, weights = kernels.get("router_topk", "torch")(
                logits, int(getattr(self.config, "num_experts_per_tok", 2)), scoring="softmax",
                renormalize=bool(getattr(self.config, "norm_topk_prob", True)), compute_dtype=torch.float32)
        self._emit(f"L{layer}.router_logits", logits)
        self._emit(f"L{layer}.topk_ids", ids)
        self._emit(f"L{layer}.topk_weights", weights)

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(msg, stacklevel=3)

    # ---- running and provenance ---------------------------------------------------------

    def run(self, input_ids: torch.Tensor) -> None:
        device = _device(self.model)
        with torch.no_grad():
            if self.config is not None:
                self.model(input_ids=input_ids.to(device), use_cache=False)
            else:
                self.model(input_ids.to(device))

    def vocab_size(self) -> int | None:
        try:
            emb = self.model.get_input_embeddings()
        except (AttributeError, NotImplementedError):  # a raw nn.Module, or a model without the hook
            return None
        return emb.num_embeddings if isinstance(emb, nn.Embedding) else None

    def describe(self) -> dict:
        knobs = {}
        impl = getattr(self.config, "_attn_implementation", None)
        if impl is not None:
            knobs["attn_implementation"] = impl
        path = getattr(self.model, "name_or_path", None) or getattr(self.config, "_name_or_path", None)
        return {"dtype": _dtype(self.model), "knobs": knobs, "model_hash": model_hash(self.model, path or None),
                "model_path": path or None}


def _library_code_only(model: nn.Module) -> bool:
    """Whether every module of ``model`` is transformers' or torch's own code, which writes
    tensors only through torch ops (they bump the version counter that tensor mode's
    references are checked by). Other code (remote code, a user's module) may write through
    ``.data`` or numpy views, which no check sees: its values are copied in the hook."""
    return all(type(m).__module__.split(".")[0] in ("transformers", "torch") for m in model.modules())


def rope_module(attn: nn.Module) -> object | None:
    """The modeling module whose ``apply_rotary_pos_emb`` a transformers attention calls, or None."""
    mod = sys.modules.get(type(attn).__module__)
    return mod if mod is not None and callable(getattr(mod, ROPE_SYMBOL, None)) else None


class RopeTap:
    """transformers' RoPE function with q/k after RoPE handed to ``emit``, its result unchanged.

    A small object rather than a closure: a closure that reads its own ``active`` flag holds
    itself, and with it the adapter, the recorder and every captured value, in a reference
    cycle that only Python's full garbage collection frees (a loop of captures then grows by
    a capture each time). ``active`` goes False when its Tracker detaches; ``original`` is
    the function it wraps (``unpatch_rope`` walks that chain).
    """

    def __init__(self, original: Callable, emit: Callable[[torch.Tensor, torch.Tensor], None] | None) -> None:
        self.original, self.emit, self.active = original, emit, True

    def __call__(self, q: torch.Tensor, k: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        q_out, k_out = self.original(q, k, *args, **kwargs)
        if self.active:
            self.emit(q_out, k_out)
        return q_out, k_out

    def switch_off(self) -> None:
        """Pass calls through from now on, holding no adapter (a tap left under another
        Tracker's keeps no capture alive)."""
        self.active, self.emit = False, None


def unpatch_rope(mod: object, wrapper: RopeTap) -> None:
    """Take ``wrapper`` out of ``mod``'s RoPE function, also when Trackers exit out of order.

    Another Tracker's wrapper may sit on top of ours (it patched after us) or below it: ours
    is switched off, and whoever is on top puts back the first function below it that is not
    a switched-off wrapper, so no stale wrapper (holding its recorder) outlives the Trackers.
    """
    wrapper.switch_off()
    if getattr(mod, ROPE_SYMBOL) is not wrapper:
        return  # a later Tracker's wrapper is on top: it unwinds past ours when it detaches
    restore = wrapper.original
    while not getattr(restore, "active", True):
        restore = restore.original
    setattr(mod, ROPE_SYMBOL, restore)


def _out_hook(module: nn.Module, emit: Callable[[torch.Tensor], None]):
    """Forward hook emitting the module's output (the first element of a tuple output)."""
    return module.register_forward_hook(
        lambda m, a, out: emit(out[0] if isinstance(out, (tuple, list)) else out))


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _dtype(model: nn.Module) -> str:
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    return str(p.dtype).removeprefix("torch.") if p is not None else "unknown"
