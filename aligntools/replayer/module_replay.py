"""Replayer: re-run one module on its *captured* inputs under another implementation or dtype.

Why: a capture comparison says *where* two engines part ways; it cannot say whether the
module at that site is the cause or just passes on an error that arrived with its input.
Replaying the module alone on the exact input the engine fed it (taken from the capture)
isolates it: error ~0 under the engine's own implementation proves the replay is faithful,
and the error under another variant is what that module alone contributes (msProbe's
single-operator "API dump + replay", Ring-linear §5.2.1 module-by-module comparison).

Supported sites and what they replay (``impl``: a ``kernels`` variant of the op, or a dtype
name, which means the op's ``reference`` variant computed in that dtype):

    L{i}.attn_norm, L{i}.mlp_norm, final_norm   rmsnorm of the residual stream before it
                                                (``embed``/``L{i-1}.resid_post``, ``L{i}.resid_mid``,
                                                ``L{last}.resid_post``)
    L{i}.q, L{i}.k                              rope variants. The pre-RoPE q/k are not sites, so
                                                they are recomputed from the captured ``L{i}.attn_norm``
                                                (projection + QK-norm, transformers' order, in the
                                                capture dtype); only RoPE changes with ``impl``
    L{i}.router_logits                          router GEMM from ``L{i}.mlp_norm``; impl = dtype
    L{i}.topk_ids, L{i}.topk_weights            router_topk variants from the captured router logits
    logits                                      lm_head GEMM from ``final_norm``; impl = dtype

The weights come from ``model`` (a transformers model or a checkpoint directory), or from the
capture's ``model_path`` attr when it has one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import kernels
from aligntools.analyzer.metrics import aggregate, derive, row_sums
from aligntools.analyzer.routing_diff import topk_rows
from aligntools.sites import parse

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SUPPORTED = ("L{i}.attn_norm", "L{i}.mlp_norm", "final_norm", "L{i}.q", "L{i}.k", "L{i}.router_logits",
             "L{i}.topk_ids", "L{i}.topk_weights", "logits")


@dataclass
class ReplayResult:
    """``output``: the replayed tensor [N, ...] (float32, or int64 ids); ``errors``: metrics of
    ``output`` against the captured value (``rel_l2``, ``max_abs``, ``mean_abs``, ... as in
    ``aligntools.metrics.derive``; for ``topk_ids`` the ``set_flip`` / ``order_flip`` fractions)."""

    site: str
    impl: str
    dtype: str
    errors: dict[str, float]
    output: torch.Tensor

    def __repr__(self) -> str:
        main = ("set_flip", "order_flip") if "set_flip" in self.errors else ("rel_l2", "max_abs")
        errs = ", ".join(f"{k}={self.errors[k]:.3g}" for k in main)
        return f"<ReplayResult {self.site} impl={self.impl} dtype={self.dtype}: {errs}>"


class _Weights:
    """Checkpoint tensors by HF name + config, from a model object or a checkpoint directory."""

    def __init__(self, model: object) -> None:
        if isinstance(model, torch.nn.Module):
            self.config = model.config.to_dict()
            self._state = dict(model.state_dict())
            self._path = None
        else:
            self._path = Path(model)
            cfg = self._path / "config.json"
            if not cfg.is_file():
                raise FileNotFoundError(f"{cfg} not found: model= must be a transformers model or an HF "
                                        f"checkpoint directory")
            self.config = json.loads(cfg.read_text())
            self._state = {}

    def get(self, *names: str) -> torch.Tensor:
        """The first of ``names`` that exists (checkpoints and models spell some differently)."""
        for name in names:
            if name in self._state:
                return self._state[name]
        if self._path is not None:
            from safetensors import safe_open

            for f in sorted(self._path.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as st:
                    for name in names:
                        if name in st.keys():
                            self._state[name] = st.get_tensor(name)
                            return self._state[name]
        raise KeyError(f"none of the weights {list(names)} found in the model")

    def has(self, name: str) -> bool:
        try:
            self.get(name)
            return True
        except KeyError:
            return False

    @property
    def eps(self) -> float:
        return float(self.config.get("rms_norm_eps", 1e-6))

    def rope_kw(self, head_dim: int) -> dict:
        rope = self.config.get("rope_parameters") or self.config.get("rope_scaling") or {}
        theta = rope.get("rope_theta", self.config.get("rope_theta", 10000.0))
        partial = rope.get("partial_rotary_factor", self.config.get("partial_rotary_factor", 1.0))
        return {"theta": float(theta), "rotary_dim": int(head_dim * partial), "style": "neox"}


def _check_same_model(captured: str, model: object) -> None:
    """Compare checkpoint file hashes (as ``compare`` does); a parameter hash or ``unknown``
    on either side cannot be compared and passes."""
    from aligntools.tracker.provenance import checkpoint_hash

    if isinstance(model, torch.nn.Module):
        path = getattr(getattr(model, "config", None), "_name_or_path", None)
        model = path if path and Path(path).is_dir() else None
    found = checkpoint_hash(model) if model is not None else None
    file_hash = re.compile(r"[0-9a-f]{64}")
    if found and file_hash.fullmatch(captured) and file_hash.fullmatch(found) and found != captured:
        raise ValueError(f"the weights in {model} (sha256 {found[:12]}) are not the model this capture was "
                         f"taken from (model_hash {captured[:12]}); pass that checkpoint as model=, or "
                         f"allow_different_models=True to replay on other weights on purpose")


def _layer(i: int, name: str) -> str:
    return f"model.layers.{i}.{name}"


def replay(capture, site: str, impl: str = "reference", model: object = None,
           dtype: str | None = None, allow_different_models: bool = False) -> ReplayResult:
    """Re-run the op that produced ``site`` on its captured inputs under ``impl``.

    ``impl``: a kernels variant of the site's op (``kernels.variants("rmsnorm")`` ...) or a dtype
    name (``"bfloat16"``: the op's reference computed in that dtype). ``dtype``: the dtype the
    inputs are cast to (default: the dtype the engine computed the site in). ``model``: the
    weights, a transformers model or checkpoint directory (default: the capture's
    ``model_path`` attr). Needs a tensor-mode capture with the input site captured.
    Weights whose checkpoint hash differs from the capture's ``model_hash`` are refused (the
    replay error would measure the other model, not ``impl``) unless ``allow_different_models``.
    """
    ds = capture.dataset
    if capture.mode != "tensor":
        raise ValueError("replay needs a tensor-mode capture (stats mode keeps no inputs)")
    model = model if model is not None else ds.attrs.get("model_path")
    if model is None:
        raise ValueError("replay needs the weights: pass model= (a transformers model or a checkpoint "
                         "directory); this capture has no model_path attr")
    weights = _Weights(model)
    if not allow_different_models:
        _check_same_model(str(ds.attrs.get("model_hash", "")), model)
    if impl in DTYPES:
        impl, dtype = "reference", impl
    dtype = dtype or _default_dtype(ds, site)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    fn = _replayer(site)
    out = fn(ds, parse(site), impl, DTYPES[dtype], weights)
    captured = _tensor(ds, site)
    return ReplayResult(site, impl, dtype, _errors(site, captured, out), out)


def _replayer(site: str) -> Callable:
    s = parse(site)
    ops = ({"attn_norm": _norm, "mlp_norm": _norm, "q": _rope, "k": _rope, "router_logits": _router_gemm,
            "topk_ids": _topk, "topk_weights": _topk} if s.layer is not None
           else {"final_norm": _norm, "logits": _lm_head})
    if s.kind not in ops:
        raise ValueError(f"replay does not support site {site!r}; supported sites: {', '.join(SUPPORTED)}")
    return ops[s.kind]


def _default_dtype(ds, site: str) -> str:
    """The dtype the engine computed ``site`` in; top-k scoring defaults to fp32 (transformers'
    ``softmax(dtype=float)``), whatever the activation dtype."""
    if parse(site).kind in ("topk_ids", "topk_weights"):
        return "float32"
    attrs = ds[site].attrs if site in ds.data_vars else {}
    return str(attrs.get("dtype", ds.attrs.get("dtype", "float32"))).removeprefix("torch.")


def _tensor(ds, site: str) -> torch.Tensor:
    if site not in ds.data_vars:
        have = ", ".join(str(v) for v in ds.data_vars)
        raise KeyError(f"replay needs site {site!r} in the capture; captured: {have}")
    return torch.from_numpy(np.ascontiguousarray(ds[site].values))


def _n_layers(ds) -> int:
    return 1 + max(parse(str(v)).layer for v in ds.data_vars if parse(str(v)).layer is not None)


def _check_impl(op: str, impl: str) -> Callable:
    if impl not in kernels.variants(op):
        raise ValueError(f"unknown {op} implementation {impl!r}; variants: {kernels.variants(op)} or a dtype "
                         f"name {sorted(DTYPES)}")
    return kernels.get(op, impl)


def _norm(ds, s, impl: str, dtype: torch.dtype, w: _Weights) -> torch.Tensor:
    fn = _check_impl("rmsnorm", impl)
    if s.layer is None:
        src, weight = f"L{_n_layers(ds) - 1}.resid_post", w.get("model.norm.weight")
    elif s.kind == "attn_norm":
        src = "embed" if s.layer == 0 else f"L{s.layer - 1}.resid_post"
        weight = w.get(_layer(s.layer, "input_layernorm.weight"))
    else:
        src, weight = f"L{s.layer}.resid_mid", w.get(_layer(s.layer, "post_attention_layernorm.weight"))
    x = _tensor(ds, src).to(dtype)  # [N, H]
    return fn(x, weight.to(dtype), w.eps).float()


def _rope(ds, s, impl: str, dtype: torch.dtype, w: _Weights) -> torch.Tensor:
    """attn_norm -> q_proj/k_proj (+bias) -> per-head QK-norm (``hf`` rmsnorm) -> RoPE ``impl``."""
    fn = _check_impl("rope", impl)
    proj = "q_proj" if s.kind == "q" else "k_proj"
    x = _tensor(ds, f"L{s.layer}.attn_norm").to(dtype)  # [N, H]
    bias = _layer(s.layer, f"self_attn.{proj}.bias")
    h = F.linear(x, w.get(_layer(s.layer, f"self_attn.{proj}.weight")).to(dtype),
                 w.get(bias).to(dtype) if w.has(bias) else None)  # [N, heads * D]
    head_dim = int(w.config.get("head_dim") or w.config["hidden_size"] // w.config["num_attention_heads"])
    h = h.view(len(h), -1, head_dim)  # [N, heads, D]
    norm = _layer(s.layer, f"self_attn.{s.kind}_norm.weight")
    if w.has(norm):
        h = kernels.get("rmsnorm", "hf")(h, w.get(norm).to(dtype), w.eps)
    positions = torch.from_numpy(np.asarray(ds["position"].values, dtype=np.int64))  # [N]
    return fn(h, positions, **w.rope_kw(head_dim)).flatten(1).float()


def _gate_weight(w: _Weights, layer: int) -> torch.Tensor:
    return w.get(_layer(layer, "mlp.gate.weight"), _layer(layer, "block_sparse_moe.gate.weight"))


def _router_gemm(ds, s, impl: str, dtype: torch.dtype, w: _Weights) -> torch.Tensor:
    if impl != "reference":
        raise ValueError(f"router_logits replays the router GEMM: impl must be a dtype name {sorted(DTYPES)}")
    x = _tensor(ds, f"L{s.layer}.mlp_norm").to(dtype)  # [N, H]
    return F.linear(x, _gate_weight(w, s.layer).to(dtype)).float()  # [N, E]


SOFTMAX_ROUTED = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")  # softmax over experts, top-k, renorm


def _topk(ds, s, impl: str, dtype: torch.dtype, w: _Weights) -> torch.Tensor:
    """Selection from the captured router logits; ``dtype`` is the scoring compute dtype."""
    fn = _check_impl("router_topk", "stable" if impl == "reference" else impl)
    model_type = w.config.get("model_type")
    if model_type not in SOFTMAX_ROUTED:
        raise ValueError(f"replay of {s} supports softmax routers ({', '.join(SOFTMAX_ROUTED)}); "
                         f"{model_type!r} routes otherwise (e.g. sigmoid + correction bias): replay "
                         f"L{s.layer}.router_logits instead")
    logits = _tensor(ds, f"L{s.layer}.router_logits")  # [N, E]
    k = int(w.config.get("num_experts_per_tok", 2))
    renorm = bool(w.config.get("norm_topk_prob", True))
    ids, weights = fn(logits, k, scoring="softmax", renormalize=renorm, compute_dtype=dtype)
    return ids if s.kind == "topk_ids" else weights.float()


def _lm_head(ds, s, impl: str, dtype: torch.dtype, w: _Weights) -> torch.Tensor:
    if impl != "reference":
        raise ValueError(f"logits replays the lm_head GEMM: impl must be a dtype name {sorted(DTYPES)}")
    x = _tensor(ds, "final_norm").to(dtype)  # [N, H]
    return F.linear(x, w.get("lm_head.weight", "model.embed_tokens.weight").to(dtype)).float()  # [N, V]


def _errors(site: str, captured: torch.Tensor, out: torch.Tensor) -> dict[str, float]:
    if parse(site).kind == "topk_ids":
        return {k: float(v.mean()) for k, v in topk_rows(captured.numpy(), out.numpy()).items()}
    metrics = derive(aggregate(row_sums(captured.numpy(), out.numpy())))
    return {k: float(v) for k, v in metrics.items()}
