"""Diagnosis rules: name the likely cause of each error jump from where it appears.

Why rules on the *pattern* of jumps: each alignment knob leaves a fingerprint on the site
graph of a layer (Ring-linear section 5.2.1 checklist). A precision fault in RMSNorm makes
the error appear at a ``*_norm`` site whose input residual is clean; a RoPE table fault
shows at q/k but not at v (v has no rotary embedding) while attn_norm is clean; an
attention-path difference shows at attn_out with q/k/v clean; a router precision fault at
router_logits with mlp_norm clean, plus top-k flips concentrated at tiny margins; an
lm_head fault at logits with final_norm clean. A *jump* is defined in ``divergence``.

An MoE layer whose top-k set flips for a few tokens sends those tokens through other experts:
their mlp_out differs by O(1) while every other token agrees, so the layer's error spikes far
above its inputs'. Such a jump is blamed on the flips only when the flipped tokens carry most
of its error; otherwise the expert computation itself is named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from aligntools import sites as S

CAUSES: dict[str, str] = {
    "embedding": "embedding weights or their dtype differ",
    "rmsnorm_precision": "RMSNorm computed in lower precision (Knobs.rmsnorm: 'hf' or 'fp32_residual')",
    "rmsnorm_eps": "RMSNorm eps/scale mismatch: error is a per-token rescaling (Knobs.rmsnorm_eps)",
    "rope": "RoPE cos/sin table precision or style (Knobs.rope, Knobs.rope_cache_dtype)",
    "qkv_projection": "q/k/v projection GEMM precision or fusion (all of q, k, v jump)",
    "attention_path": "attention backend, prefill-vs-decode path or KV-cache dtype "
                      "(Knobs.attention, Knobs.decode, Knobs.kv_cache_dtype)",
    "residual_precision": "residual add in lower precision (fused add+RMSNorm; Knobs.rmsnorm='fp32_residual')",
    "router_precision": "router GEMM/scoring precision (Knobs.router_dtype)",
    "unstable_topk": "top-k flips at near-tie margins: any rounding upstream flips them "
                     "(Knobs.topk='stable', Knobs.router_dtype)",
    "routing_disagreement": "top-k flips at large margins: router inputs really differ upstream",
    "gate_weights": "top-k gate weights (renormalisation or precision) differ",
    "mlp_path": "expert/MLP computation (Knobs.expert_sum_order, Knobs.tp, weight dtype)",
    "expert_flip": "tokens whose top-k experts flipped run through other experts: the spike is "
                   "routing, not expert arithmetic (Knobs.topk='stable', Knobs.router_dtype, router replay)",
    "lm_head_precision": "lm_head GEMM / softmax precision (Knobs.lm_head_dtype)",
    "logprob_computation": "logprob/entropy derivation from logits",
    "nonfinite": "NaN/Inf on one side only",
    "nonfinite_both": "NaN/Inf on both sides: the same blow-up in both engines (a NaN/Inf weight, an overflow "
                      "both compute), never agreement",
    "unexplained": "error jumps at a site no rule covers: re-run its op under another implementation "
                   "(aligntools.replay) or capture the modules inside it",
}

_KIND_CAUSE = {
    "embed": "embedding", "attn_norm": "rmsnorm_precision", "mlp_norm": "rmsnorm_precision",
    "final_norm": "rmsnorm_precision", "q": "rope", "k": "rope", "v": "qkv_projection",
    "attn_out": "attention_path", "resid_mid": "residual_precision", "resid_post": "residual_precision",
    "router_logits": "router_precision", "topk_weights": "gate_weights", "mlp_out": "mlp_path",
    "logits": "lm_head_precision", "logprobs": "logprob_computation", "entropy": "logprob_computation",
}
_NORMS = ("attn_norm", "mlp_norm", "final_norm")
RADIAL_FRACTION = 0.9
"""An error is a per-token rescaling (eps-like) when at least this share of its energy lies
along the token's own vector, i.e. cosine stays ~1 while the norm changes."""
NEAR_TIE_SHARE = 0.5
FLIP_ERROR_SHARE = 0.5
"""A jump at mlp_out/topk_weights is put down to the layer's expert flips when the flipped
tokens carry at least this share of its error energy (per-token rel. L2 squared)."""


@dataclass(frozen=True)
class Finding:
    """One named cause. ``also``: later sites where the same cause fired (e.g. every layer)."""

    cause: str
    site: str
    evidence: str
    confidence: float
    also: tuple[str, ...] = field(default=())

    @property
    def description(self) -> str:
        return CAUSES[self.cause]

    def __str__(self) -> str:
        more = f" (also {', '.join(self.also[:4])}{'...' if len(self.also) > 4 else ''})" if self.also else ""
        return f"[{self.confidence:.2f}] {self.cause} at {self.site}{more}: {self.description}. {self.evidence}"


def _confidence(contrast: float) -> float:
    """0.4 at a 1x contrast, +0.15 per decade, capped at 0.95 (inf = clean input)."""
    if not math.isfinite(contrast):
        return 0.95
    return float(min(0.95, max(0.05, 0.4 + 0.15 * math.log10(max(contrast, 1e-12)))))


def radial_share(per_token: pd.DataFrame) -> float:
    """Median share of error energy along a (1 - perpendicular share): for b = a + d,
    ``1 - cos(a, b) ~ |d_perp|^2 / (2|a|^2)`` while ``rel_l2^2 = |d|^2 / |a|^2``."""
    t = per_token[per_token["rel_l2"] > 0]
    if t.empty:
        return float("nan")
    perp = (1.0 - t["cosine"]) / (t["rel_l2"] ** 2 / 2)
    return float(1.0 - np.clip(perp, 0.0, 1.0).median())


def _jump_finding(site: str, g: pd.DataFrame, per_token: Callable[[str], pd.DataFrame]) -> Finding:
    s = S.parse(site)
    r = g.loc[site]
    cause = _KIND_CAUSE.get(s.kind, "unexplained")
    ups = ", ".join(f"{u} {g.loc[u, 'error']:.2g}" for u in r["upstream"]) or "no input site"
    evidence = f"rel. L2 error {r['error']:.3g} (limit {r['limit']:.2g}, {_growth(r['growth'])}) vs inputs: {ups}"
    contrast = r["growth"]
    if s.kind in _NORMS and "cosine" in per_token(site):
        share = radial_share(per_token(site))
        if share >= RADIAL_FRACTION:
            cause = "rmsnorm_eps"
        evidence += f"; {share:.0%} of the error is a per-token rescaling"
    if s.kind in ("q", "k"):
        v = f"L{s.layer}.v"
        if v in g.index:
            e_v = g.loc[v, "error"]
            if g.loc[v, "jumps"]:
                cause = "qkv_projection"
            else:
                contrast = min(contrast, r["error"] / e_v if e_v > 0 else math.inf)
            evidence += f"; v error {e_v:.2g}"
    return Finding(cause, site, evidence, _confidence(contrast))


def _growth(factor: float) -> str:
    return "from a clean input" if factor == math.inf else f"x{factor:.3g} its inputs' error"


def _flip_finding(site: str, g: pd.DataFrame, per_token: Callable[[str], pd.DataFrame]) -> Finding | None:
    """``expert_flip`` when the layer's flipped tokens carry most of ``site``'s error; None when
    they do not (the caller then names the expert path with ``_jump_finding``)."""
    s, r = S.parse(site), g.loc[site]
    flips, err = _rows(per_token, f"L{s.layer}.topk_ids", "set_flip"), _rows(per_token, site, "rel_l2")
    head = f"{site} error {r['error']:.3g} ({_growth(r['growth'])})"
    if flips is None or err is None:
        return Finding("expert_flip", site, f"{head}; per-token top-k ids were not captured, so whether the "
                       "flipped tokens carry the error cannot be told", 0.4)
    flipped, e = flips.to_numpy(float) > 0, err.to_numpy(float)
    energy = np.nan_to_num(e) ** 2
    share = float(energy[flipped].sum() / energy.sum()) if energy.sum() > 0 else 0.0
    if share < FLIP_ERROR_SHARE:
        return None
    rest = f"{np.nanmedian(e[~flipped]):.2g}" if (~flipped).any() else "n/a"
    evidence = (f"{head}; {int(flipped.sum())} of {len(flipped)} tokens changed top-k experts at L{s.layer} "
                f"and carry {share:.0%} of the error (median per-token rel. L2 {np.nanmedian(e[flipped]):.2g} "
                f"vs {rest} for the others)")
    return Finding("expert_flip", site, evidence, 0.95 * share)


def _rows(per_token: Callable[[str], pd.DataFrame], site: str, metric: str) -> pd.Series | None:
    """Per-token ``metric`` of ``site``, None when not compared (stats captures lack set_flip)."""
    try:
        return per_token(site).get(metric)
    except KeyError:
        return None


def _routing_findings(routing: pd.DataFrame) -> list[Finding]:
    out = []
    for layer, r in routing[routing["set_flip"] > 0].iterrows():
        near = r["near_tie"]
        cause = "unstable_topk" if near >= NEAR_TIE_SHARE else "routing_disagreement"
        evidence = (f"{r['set_flip']:.1%} of tokens changed top-{int(r['k'])} set "
                    f"({r['order_flip']:.1%} order-only); median margin of flipped tokens "
                    f"{r['margin_flipped']:.2g} vs {r['margin_all']:.2g} overall; "
                    f"{near:.0%} of flips within the score error")
        conf = 0.5 if not np.isfinite(near) else 0.5 + 0.45 * abs(near - NEAR_TIE_SHARE) * 2
        out.append(Finding(cause, f"L{layer}.topk_ids", evidence, float(min(conf, 0.95))))
    return out


def _nonfinite_findings(table: pd.DataFrame) -> list[Finding]:
    if "nonfinite_mismatch" not in table:
        return []
    bad = table[table["nonfinite_mismatch"].fillna(0) > 0]
    both = table[(table["nonfinite_mismatch"].fillna(0) == 0)
                 & (table["nonfinite_a"].fillna(0) + table["nonfinite_b"].fillna(0) > 0)]
    return [Finding("nonfinite", site, f"{int(r['nonfinite_mismatch'])} elements are NaN/Inf on one "
                    f"side only (a: {int(r['nonfinite_a'])}, b: {int(r['nonfinite_b'])} non-finite)", 0.95)
            for site, r in bad.iterrows()] + [
        Finding("nonfinite_both", site, f"{int(r['nonfinite_a'])} elements are NaN/Inf in a and "
                f"{int(r['nonfinite_b'])} in b, at the same places", 0.95) for site, r in both.iterrows()]


def diagnose(g: pd.DataFrame, table: pd.DataFrame, routing: pd.DataFrame,
             per_token: Callable[[str], pd.DataFrame], prefer: Sequence[str] = ()) -> list[Finding]:
    """Findings in execution order of their quoted site, one per cause (repeats in ``also``).

    g: ``divergence.growth`` table; table: the comparison table (for NaN/Inf counts);
    routing: ``routing_diff`` table; per_token: site -> per-token metrics (rel_l2, cosine).
    prefer: sites a verdict names, most important first. A cause found at several sites quotes
    the numbers of the first preferred one among them (else its earliest site): a report whose
    verdict fails layer 1 must not explain it with layer 0's flip rate, which passed.
    """
    flipped_layers = set(routing.index[routing["set_flip"] > 0])
    raw: list[Finding] = _nonfinite_findings(table) + _routing_findings(routing)
    for site in g.index[g["jumps"]]:
        s = S.parse(site)
        if site in {f.site for f in raw if f.cause in ("nonfinite", "nonfinite_both")}:
            continue
        flip = _flip_finding(site, g, per_token) if s.kind in ("topk_weights", "mlp_out") \
            and s.layer in flipped_layers else None
        raw.append(flip or _jump_finding(site, g, per_token))
    raw.sort(key=lambda f: S.order_key(f.site))
    rank = {site: i for i, site in reversed(list(enumerate(prefer)))}
    grouped: dict[str, list[Finding]] = {}
    for f in raw:
        grouped.setdefault(f.cause, []).append(f)
    out = []
    for same in grouped.values():
        quoted = min(same, key=lambda f: rank.get(f.site, len(rank)))  # min keeps the earliest of equals
        out.append(Finding(quoted.cause, quoted.site, quoted.evidence, quoted.confidence,
                           tuple(f.site for f in same if f is not quoted)))
    return sorted(out, key=lambda f: S.order_key(f.site))
