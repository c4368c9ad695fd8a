"""First divergence: the earliest site whose error is not explained by its inputs' error.

Why growth rather than "first site above tolerance": once one module goes wrong, every
site after it is wrong too; the culprit is where the error *jumps*. Each site's relative
error ``e`` is set against ``e_up``, the largest error among the sites that feed it (the
dataflow of a decoder layer ``sites.LAYER_DATAFLOW``: e.g. q/k/v <- attn_norm <- previous resid_post). A site
*jumps* when

    e > limit(site)            (above the noise floor: identical or fp-noise captures never jump)
    e > threshold * e_up       (growth beyond what its inputs bring, default 4x)

and the first divergence is the first jumping site in execution order. Relative errors of
linear maps and norms pass through at ~1x, so 4x leaves room for mild amplification while a
precision fault (error from ~0 to ~1e-3) is a jump of orders of magnitude. A NaN/Inf on one
side only counts as infinite error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from aligntools import sites as S

GROWTH_THRESHOLD = 4.0

@dataclass(frozen=True)
class Divergence:
    """Where the error starts. ``factor`` = error / upstream error (inf from a clean input)."""

    site: str
    factor: float
    reason: str
    error: float
    upstream_error: float
    upstream: tuple[str, ...]
    limit: float

    def __str__(self) -> str:
        jump = "from a clean input" if self.factor == np.inf else f"jump x{self.factor:.3g}"
        return f"first divergence at {self.site} ({jump}): {self.reason}"


def _direct(site: str, n_layers: int) -> tuple[str, ...]:
    """The sites that feed ``site`` directly (``sites.LAYER_DATAFLOW`` / ``GLOBAL_DATAFLOW``)."""
    s = S.parse(site)
    if s.layer is None:
        last = f"L{n_layers - 1}.resid_post" if n_layers else "embed"
        return tuple(last if u == "@last_resid" else u for u in S.GLOBAL_DATAFLOW.get(s.kind, ()))
    resid_in = f"L{s.layer - 1}.resid_post" if s.layer > 0 else "embed"
    return tuple(resid_in if u == "@resid_in" else f"L{s.layer}.{u}"
                 for u in S.LAYER_DATAFLOW.get(s.kind, ()))


def upstream_sites(site: str, available: list[str]) -> tuple[str, ...]:
    """Nearest *available* sites feeding ``site`` (walks past sites that were not captured).

    Unknown sites (raw module paths) take the previous available site in execution order.
    """
    order = S.sort_sites(list(available))
    avail = set(order)
    if S.parse(site).kind not in S.LAYER_DATAFLOW and site not in S.GLOBAL_DATAFLOW:
        i = order.index(site) if site in avail else len(order)
        return tuple(order[i - 1: i]) if i > 0 else ()
    n_layers = 1 + max((S.parse(x).layer for x in order if S.parse(x).layer is not None), default=-1)
    found: list[str] = []
    todo, seen = list(_direct(site, n_layers)), set()
    while todo:
        u = todo.pop(0)
        if u in seen:
            continue
        seen.add(u)
        if u in avail:
            found.append(u)
        else:
            todo.extend(_direct(u, n_layers))
    return tuple(S.sort_sites(found))


def jumps(error: float, upstream_error: float, limit: float, threshold: float = GROWTH_THRESHOLD) -> bool:
    """The rule itself: above the limit and more than ``threshold`` x the inputs' error (an
    infinite input error explains anything). Shared with ``aligntools.drill``, one level down."""
    return error > limit and (error > threshold * upstream_error if np.isfinite(upstream_error) else False)


def growth(errors: pd.Series, limits: pd.Series, threshold: float = GROWTH_THRESHOLD) -> pd.DataFrame:
    """Per site: error, limit, upstream sites, upstream error, growth factor, ``jumps``.

    errors, limits: indexed by site (relative L2; inf for one-sided NaN/Inf).
    """
    sites = S.sort_sites([s for s in errors.index if np.isfinite(errors[s]) or errors[s] == np.inf])
    rows = []
    for site in sites:
        ups = upstream_sites(site, sites)
        e, e_up = float(errors[site]), max((float(errors[u]) for u in ups), default=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = float(np.float64(e) / np.float64(e_up)) if e > 0 else 0.0
        rows.append((site, e, float(limits[site]), ups, e_up, factor, jumps(e, e_up, float(limits[site]), threshold)))
    return pd.DataFrame(rows, columns=["site", "error", "limit", "upstream", "upstream_error",
                                       "growth", "jumps"]).set_index("site")


def first_divergence(g: pd.DataFrame) -> Divergence | None:
    """The first jumping site of a ``growth`` table, with the numbers that convicted it."""
    hits = g[g["jumps"]]
    if hits.empty:
        return None
    site, r = hits.index[0], hits.iloc[0]
    ups = ", ".join(f"{u}={g.loc[u, 'error']:.3g}" for u in r["upstream"]) or "none (first site)"
    growth_txt = "its inputs are exact" if r["upstream_error"] == 0 else f"{r['growth']:.3g}x its inputs' error"
    reason = f"relative L2 error {r['error']:.3g} > limit {r['limit']:.3g} and {growth_txt} (inputs: {ups})"
    return Divergence(site=site, factor=float(r["growth"]), reason=reason, error=float(r["error"]),
                      upstream_error=float(r["upstream_error"]), upstream=tuple(r["upstream"]),
                      limit=float(r["limit"]))
