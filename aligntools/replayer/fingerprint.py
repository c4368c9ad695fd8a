"""Engine fingerprint: the minirl knob setting whose numerics are closest to a real engine's.

Why: a gate says *that* vLLM disagrees with the trainer; the fingerprint says *which* of the
choices an inference engine makes (fused add+norm, cached RoPE table, lm_head / router
precision, expert summation order, ...) reproduce that disagreement, and how much of it
no knob explains. minirl re-runs the captured token ids under each setting; a coordinate
search over the knobs keeps a change when it brings minirl closer to the engine, site by site.

Closeness (the search objective, ``score``): the mean over sites of log10(rel-L2 error vs the
engine), so an early site counts as much as the logits. ``distance``: the mean |Δ logprob|
between the best setting and the engine, the unit the gate and the RL corrections care about.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from aligntools.sites import parse

SEARCH: dict[str, tuple] = {
    # first: a quantized engine's gap dwarfs the rest
    "weights": ("none", "fp8_e4m3", "int8", "int4", "fp8_e4m3_tensor"),
    "activations": ("none", "fp8"),  # W8A8: vLLM's fp8 linear layers quantize their inputs per token
    "rmsnorm": ("fused_add", "hf", "fp32_residual", "bf16_compute"),
    "activation": ("fused_silu_mul", "hf"),
    "rope": ("cached_table", "hf", "fp32_compute"),
    "rope_cache_dtype": ("act", "float32"),
    "attention": ("sdpa", "eager"),
    "lm_head_dtype": ("act", "float32"),
    "router_dtype": ("act", "float32"),
    "topk": ("unstable", "stable", "torch"),  # tie order: told apart by a token whose k-th and (k+1)-th experts tie
    "expert_sum_order": ("topk_slot", "expert_id", "grouped_mm"),  # fused MoE, transformers eager, its default
    "batch_invariant": (False, True),
    "linear_attention": ("recurrent", "chunked"),  # token by token vs transformers' chunks: apart past 64 tokens
}
"""Knobs a prefill capture can tell apart (decode / KV-cache / TP knobs need other captures)."""
MOE_ONLY = ("router_dtype", "topk", "expert_sum_order")
"""Knobs searched only on MoE models (on a dense model they change nothing)."""
LINEAR_ATTENTION_ONLY = ("linear_attention",)
"""Knobs searched only on models with linear-attention layers (``LINEAR_ATTENTION``)."""
LINEAR_ATTENTION = ("bailing_hybrid",)
"""model_types with linear-attention layers (BailingHybrid's KDA)."""
OWN_ATTENTION = ("bailing_hybrid",)
"""model_types whose minirl model has its own attention, so ``Knobs(activations=...)`` is refused
(``Transformer.quantizes_activations``; a test holds the two equal)."""


@dataclass(frozen=True)
class Fingerprint:
    """``knobs``: the closest minirl setting; ``distance``: its mean |Δ logprob| vs the engine;
    ``table``: per site rel-L2 vs the engine of minirl ``hf_exact`` (= transformers in the
    engine's dtype), ``typical`` and the ``best`` setting; ``explained``: per knob where the best
    setting differs from ``hf_exact`` and matters, the distance and score when that knob alone
    goes back; ``gap_start``: the first site (execution order) where the best setting is more than
    a tenth of the dtype's epsilon away from the engine (rel-L2), None when no site is."""

    knobs: object
    distance: float
    score: float
    table: pd.DataFrame
    explained: pd.DataFrame
    gap_start: str | None
    evaluated: int = field(default=0)

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={v!r}" for k, v in self.explained["engine_value"].items()) or "none"
        gap = (f"remaining gap starts at {self.gap_start} (rel-L2 {self.table['best'][self.gap_start]:.2g})"
               if self.gap_start else "no remaining divergence")
        return (f"Fingerprint(distance={self.distance:.3g} mean |Δ logprob|, knobs differing from hf_exact: "
                f"{changed}; {gap}; {self.evaluated} settings tried)")

    def _repr_html_(self) -> str:
        """A table in notebooks instead of the one-line repr."""
        from aligntools.viz.tables import fingerprint_html

        return fingerprint_html(self)


def fingerprint(capture, model_path: str | os.PathLike, *, passes: int = 2, progress: bool = False,
                allow_different_models: bool = False) -> Fingerprint:
    """Search minirl knobs for the setting closest to ``capture`` (a prefill capture of any
    engine, e.g. ``aligntools.capture(vllm_llm, ids)`` or ``aligntools.capture(sglang_runner, ids)``) of
    checkpoint ``model_path``.

    ``passes``: coordinate-search sweeps (>= 1; the search stops early once a sweep changes
    nothing). Refused before any engine runs: a capture of another model (its ``model_hash``
    or its layer count / hidden size differ from ``model_path``'s; ``allow_different_models``
    skips the hash check, e.g. for quantized weights) and a capture holding NaN or inf values
    (the error metrics would drop them and report a distance of 0)."""
    from tqdm.auto import tqdm

    from aligntools.analyzer.comparison import as_dataset, compare
    from aligntools.tracker.tracker import capture as run_capture
    from minirl import Engine, Knobs, read_config, read_safetensors

    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes={passes!r}: must be an integer >= 1 (sweeps of the knob search; default 2)")
    ds = as_dataset(capture)
    ids = _prefill_ids(ds)  # [B, S]
    dtype = ds.attrs.get("dtype", "float32")
    sites = [s for s in ds.data_vars if s in _float_sites(ds)]
    config, weights = read_config(model_path), read_safetensors(model_path)
    _check_same_model(ds, ids, model_path, config, allow_different_models)
    _check_finite(ds, sites)
    search = {k: v for k, v in SEARCH.items() if (k not in MOE_ONLY or _is_moe(config))
              and (k not in LINEAR_ATTENTION_ONLY or config.get("model_type") in LINEAR_ATTENTION)}
    if config.get("model_type") in OWN_ATTENTION:  # the engine refuses activations=fp8 there
        search.pop("activations")
    cache: dict[tuple, tuple[float, float, object]] = {}
    bar = tqdm(desc="fingerprint", unit="setting", disable=not progress)

    def evaluate(knobs) -> tuple[float, float, object]:
        key = tuple(sorted(knobs.to_dict().items()))
        if key not in cache:
            engine = Engine(config, weights, dtype=dtype, knobs=knobs)
            cmp = compare(ds, run_capture(engine, ids, sites=",".join(sites), progress=False), sites=sites)
            cache[key] = (_score(cmp), _dlogprob(cmp), cmp)
            bar.update(1)
        return cache[key]

    best = Knobs.typical_inference()
    for _ in range(passes):
        improved = False
        for name, values in search.items():
            for value in values:
                candidate = best.replace(**{name: value})
                if evaluate(candidate)[0] < evaluate(best)[0] - 1e-9:
                    best, improved = candidate, True
        if not improved:
            break
    bar.close()
    reference = Knobs.hf_exact()
    explained = _explained(best, reference, search, evaluate)
    table = pd.DataFrame({name: _rel_l2(evaluate(k)[2]) for name, k in
                          (("hf_exact", reference), ("typical", Knobs.typical_inference()), ("best", best))})
    eps = torch.finfo(getattr(torch, dtype)).eps
    gaps = table.index[table["best"] > eps / 10]
    return Fingerprint(best, evaluate(best)[1], evaluate(best)[0], table, explained,
                       str(gaps[0]) if len(gaps) else None, len(cache))


def _explained(best, reference, search: dict, evaluate) -> pd.DataFrame:
    rows = []
    for name in search:
        if getattr(best, name) != getattr(reference, name):
            score, distance, _ = evaluate(best.replace(**{name: getattr(reference, name)}))
            if abs(score - evaluate(best)[0]) > 1e-9:  # a knob that changes nothing explains nothing
                rows.append({"knob": name, "engine_value": getattr(best, name),
                             "trainer_value": getattr(reference, name), "distance_if_reverted": distance,
                             "score_if_reverted": score})
    cols = ["knob", "engine_value", "trainer_value", "distance_if_reverted", "score_if_reverted"]
    return pd.DataFrame(rows, columns=cols).set_index("knob")


def _check_same_model(ds, ids: torch.Tensor, model_path: str | os.PathLike, config: dict,
                      allow_different_models: bool) -> None:
    """Another model's capture would be "fingerprinted" against the wrong weights: refuse it
    by its checkpoint hash (when both sides have one) and by shape (layers, hidden size,
    vocabulary), which also catches captures of models built in memory."""
    from aligntools.tracker.provenance import checkpoint_hash

    captured, found = str(ds.attrs.get("model_hash", "")), checkpoint_hash(model_path)
    file_hash = re.compile(r"[0-9a-f]{64}")
    if (not allow_different_models and found and file_hash.fullmatch(captured) and file_hash.fullmatch(found)
            and captured != found):
        raise ValueError(f"this capture was taken from another model (model_hash {captured[:12]}) than {model_path} "
                         f"(sha256 {found[:12]}); pass the checkpoint it was taken from, or "
                         f"allow_different_models=True if it holds the same model (e.g. quantized weights)")
    top_layer = max((parse(s).layer for s in ds.data_vars if parse(s).layer is not None), default=-1)
    hidden, top_id = ds.sizes.get("hidden"), int(ids.max())
    misfits = [
        (f"a site of layer {top_layer}", "num_hidden_layers", top_layer >= config.get("num_hidden_layers", math.inf)),
        (f"hidden size {hidden}", "hidden_size", hidden is not None and hidden != config.get("hidden_size", hidden)),
        (f"token id {top_id}", "vocab_size", top_id >= config.get("vocab_size", math.inf))]
    for seen, key, misfit in misfits:
        if misfit:
            raise ValueError(f"this capture does not fit {model_path}: it has {seen}, the checkpoint's {key} is "
                             f"{config.get(key)}; pass the checkpoint the capture was taken from")


def _check_finite(ds, sites: list[str]) -> None:
    """NaN / inf in the rows a site emitted would drop out of the error metrics (a distance of 0
    for a broken capture): refuse, naming the site, the count and the first row. ``logprobs``
    is NaN by design where the next token is unknown (the last position): only inf counts there."""
    for site in sites:
        values = np.asarray(ds[site].values).reshape(ds.sizes["token"], -1)
        emitted = ds.coords.get(f"emitted.{site}")
        rows = (np.isinf(values) if site == "logprobs" else ~np.isfinite(values)).any(axis=1)
        if emitted is not None:
            rows &= np.asarray(emitted.values) == 1
        if rows.any():
            first = int(np.flatnonzero(rows)[0])
            raise ValueError(f"capture site {site} holds NaN or inf in {int(rows.sum())} token row(s), the first at "
                             f"request {int(ds['request'].values[first])} position "
                             f"{int(ds['position'].values[first])}; the fingerprint needs finite activations "
                             f"(recapture, or drop the site: capture.dataset.drop_vars({site!r}))")


def _prefill_ids(ds) -> torch.Tensor:
    """Token ids [B, S] of the capture's prefill rows (step 0), by request and position."""
    step0 = ds["step"].values == 0
    req, pos, tok = (ds[c].values[step0] for c in ("request", "position", "token_id"))
    n_req, lens = int(req.max()) + 1, np.bincount(req)
    if len(set(lens.tolist())) != 1:
        raise ValueError(f"fingerprint needs a prefill capture of equal-length sequences "
                         f"(aligntools.capture(engine, ids)); got lengths {sorted(set(lens.tolist()))}")
    out = torch.empty(n_req, int(lens[0]), dtype=torch.long)
    out[torch.from_numpy(req), torch.from_numpy(pos)] = torch.from_numpy(tok).long()
    return out


def _float_sites(ds) -> set[str]:
    return {s for s in ds.data_vars if "token" in ds[s].dims and ds[s].dtype.kind == "f" and not s.startswith("emitted")}


def _is_moe(config: dict) -> bool:
    return any(isinstance(config.get(k), int) and config[k] > 0 for k in ("num_experts", "num_local_experts"))


def _rel_l2(cmp) -> pd.Series:
    return pd.Series({s: r.summary.get("rel_l2", math.nan) for s, r in cmp.results.items()}, dtype=float)


def _score(cmp) -> float:
    errs = _rel_l2(cmp).dropna()
    return float(np.log10(errs + 1e-9).mean())


def _dlogprob(cmp) -> float:
    r = cmp.results.get("logprobs")
    return float(r.summary.get("mean_abs", math.nan)) if r is not None else math.nan
