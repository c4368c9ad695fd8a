"""The engine-neutral site vocabulary and its dataflow (docs/sites.md).

Every engine adapter names what it captures with these strings, so a capture from
transformers and one from an inference engine line up key by key. Why a fixed vocabulary
instead of module paths: module paths differ per engine (``model.layers.0.self_attn.q_proj``
vs a fused ``qkv_proj``), while the *math* at each point is the same.

Token layout convention (all engines): every site tensor is flat over tokens, shape
``[N, ...]`` with padding removed, plus per-token metadata (request index, position, decode
step). See ``docs/architecture.md``.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass

# Per-layer sites in execution order, with the name of each trailing dim.
LAYER_SITES: dict[str, tuple[str, ...]] = {
    "attn_norm": ("hidden",),
    "q": ("q_dim",),  # after RoPE (and QK-norm where the model has it), heads flattened
    "k": ("kv_dim",),  # after RoPE
    "v": ("kv_dim",),
    "attn_out": ("hidden",),  # after o_proj
    "resid_mid": ("hidden",),  # residual stream after the attention block
    "mlp_norm": ("hidden",),
    "router_logits": ("expert",),  # MoE only
    "topk_ids": ("k",),  # MoE only
    "topk_weights": ("k",),  # MoE only
    "mlp_out": ("hidden",),
    "resid_post": ("hidden",),  # residual stream after the layer (= HF hidden_states[i+1]
    # for every layer but the last, where HF reports the final-normed value)
}

# Model-level sites in execution order.
GLOBAL_SITES_BEFORE: dict[str, tuple[str, ...]] = {"embed": ("hidden",)}
GLOBAL_SITES_AFTER: dict[str, tuple[str, ...]] = {
    "final_norm": ("hidden",),
    "logits": ("vocab",),
    "logprobs": (),  # log p(next token | prefix), raw (pre temperature/top-p); NaN where unknown
    "entropy": (),  # entropy of the raw next-token distribution
}

ROUTING_SITES = ("router_logits", "topk_ids", "topk_weights")

# Direct inputs of each per-layer site; "@resid_in" = the residual stream entering the layer
# (``embed`` for layer 0, else the previous layer's ``resid_post``). docs/sites.md draws it.
LAYER_DATAFLOW: dict[str, tuple[str, ...]] = {
    "attn_norm": ("@resid_in",),
    "q": ("attn_norm",), "k": ("attn_norm",), "v": ("attn_norm",),
    "attn_out": ("q", "k", "v"),
    "resid_mid": ("@resid_in", "attn_out"),
    "mlp_norm": ("resid_mid",),
    "router_logits": ("mlp_norm",),
    "topk_ids": ("router_logits",), "topk_weights": ("router_logits",),
    "mlp_out": ("mlp_norm", "topk_weights"),
    "resid_post": ("resid_mid", "mlp_out"),
}
# Model-level sites' direct inputs; "@last_resid" = the last layer's resid_post.
GLOBAL_DATAFLOW: dict[str, tuple[str, ...]] = {
    "embed": (), "final_norm": ("@last_resid",), "logits": ("final_norm",),
    "logprobs": ("logits",), "entropy": ("logits",),
}

TOKEN_COORDS = ("token_id", "position", "request", "step")
"""Per-row coords of every capture: the input token, its absolute position, the request it
belongs to, and the step (0 = prefill / plain forward, k = k-th decode step)."""
_LAYER_RE = re.compile(r"^L(\d+)\.(\w+)$")


@dataclass(frozen=True)
class SiteName:
    """A parsed site: ``layer`` is None for model-level sites."""

    layer: int | None
    kind: str

    def __str__(self) -> str:
        return self.kind if self.layer is None else f"L{self.layer}.{self.kind}"


def parse(site: str) -> SiteName:
    """Parse ``"L3.q"`` -> SiteName(3, "q"); ``"logits"`` -> SiteName(None, "logits")."""
    m = _LAYER_RE.match(site)
    if m:
        return SiteName(int(m.group(1)), m.group(2))
    return SiteName(None, site)


def all_sites(n_layers: int, moe_layers: set[int] | None = None) -> list[str]:
    """Every known site of an ``n_layers`` model in execution order."""
    moe_layers = set() if moe_layers is None else moe_layers
    out = list(GLOBAL_SITES_BEFORE)
    for i in range(n_layers):
        for kind in LAYER_SITES:
            if kind in ROUTING_SITES and i not in moe_layers:
                continue
            out.append(f"L{i}.{kind}")
    out.extend(GLOBAL_SITES_AFTER)
    return out


@functools.lru_cache(maxsize=1 << 14)
def order_key(site: str) -> tuple[int, int, str]:
    """Sort key that puts sites in execution order (unknown raw module paths last); cached,
    as every capture sorts its sites a few times."""
    s = parse(site)
    if s.layer is None:
        if s.kind in GLOBAL_SITES_BEFORE:
            return (-1, list(GLOBAL_SITES_BEFORE).index(s.kind), "")
        if s.kind in GLOBAL_SITES_AFTER:
            return (1 << 30, list(GLOBAL_SITES_AFTER).index(s.kind), "")
        return (1 << 31, 0, site)
    kinds = list(LAYER_SITES)
    return (s.layer, kinds.index(s.kind) if s.kind in kinds else len(kinds), s.kind)


def sort_sites(sites: list[str]) -> list[str]:
    """Sites sorted in execution order."""
    return sorted(sites, key=order_key)


def trailing_dims(site: str) -> tuple[str, ...]:
    """Names of the dims after ``token`` for a site (raw module paths get ``feature``)."""
    kind = parse(site).kind
    for table in (LAYER_SITES, GLOBAL_SITES_BEFORE, GLOBAL_SITES_AFTER):
        if kind in table:
            return table[kind]
    return ("feature",)


def select(patterns: str | list[str], available: list[str]) -> list[str]:
    """Expand glob patterns (``"*"``, ``"L*.resid_post,logits"``) against available sites.

    Raises ValueError naming the pattern and listing what is available when a pattern
    matches nothing: a typo must not silently capture nothing.
    """
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen: list[str] = []
    for pat in patterns:
        hits = [s for s in available if fnmatch.fnmatchcase(s, pat)]
        if not hits:
            raise ValueError(
                f"site pattern {pat!r} matches no site; available sites: {', '.join(available)}"
            )
        chosen.extend(h for h in hits if h not in chosen)
    return sort_sites(chosen)
