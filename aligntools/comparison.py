"""The result of ``compare``: per-site/per-token metrics plus the verdicts built on them.

Why one object with lazy views: the expensive part (reading every captured element) is
done once by ``compare``; the table, first divergence, diagnosis, plots and widgets are
cheap re-readings of the same per-token metrics, so notebooks can ask for any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd
import xarray as xr

from aligntools import sites as S
from aligntools.diagnosis import Finding, diagnose
from aligntools.divergence import GROWTH_THRESHOLD, Divergence, first_divergence, growth
from aligntools.token_align import Alignment
from aligntools.tolerance import Tolerance, coarser

GATED_BASES = ("tensor", "stats")
TABLE_COLUMNS = [
    "layer", "basis", "dtype", "n_tokens", "max_abs", "mean_abs", "rel_l2", "cosine", "sqnr_db",
    "permille_err", "ulp_max", "nonfinite_a", "nonfinite_b", "nonfinite_mismatch", "missing_a",
    "missing_b", "exact",
    "set_flip", "order_flip", "kl_max", "kl_mean", "dlogprob_max", "dlogprob_mean",
    "dlogprob_p99", "top1_agree", "limit", "growth", "passes",
]



class SiteVerdict:
    """``passes`` / ``failures`` read off a per-site table with a boolean ``passes`` column
    (shared by ``Comparison`` and the accuracy gate's ``GateReport``)."""

    table: pd.DataFrame

    @property
    def passes(self) -> bool:
        """True when every gated site is within its tolerance limit."""
        return bool(self.table["passes"].all())

    @property
    def failures(self) -> list[str]:
        """Sites over their limit, in execution order."""
        return list(self.table.index[~self.table["passes"]])

@dataclass(frozen=True)
class SiteResult:
    """Metrics of one site. ``rows``: per-token arrays [N]; ``summary``: site-level numbers.

    basis: ``tensor`` (full tensors), ``stats`` (stats-mode lower bounds), ``ids`` (integer
    top-k ids: flips), ``skipped`` (nothing comparable; ``note`` says why).
    """

    site: str
    basis: str
    dtype_a: str
    dtype_b: str
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def dtype(self) -> str:
        return coarser(self.dtype_a, self.dtype_b)


@dataclass(frozen=True)
class Comparison(SiteVerdict):
    """Capture ``b`` measured against capture ``a`` (``a`` is the trusted side)."""

    results: dict[str, SiteResult]
    alignment: Alignment
    tolerance: Tolerance
    routing: pd.DataFrame
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    threshold: float = GROWTH_THRESHOLD
    labels: tuple[str, str] = ("a", "b")

    @property
    def sites(self) -> list[str]:
        return list(self.results)

    @cached_property
    def table(self) -> pd.DataFrame:
        """Sites x metrics in execution order (index: site name). ``limit`` is the tolerance,
        ``growth`` error / inputs' error, ``passes`` False where error > limit or NaN/Inf
        appear on one side only (ids/skipped sites are not gated and pass)."""
        recs = [{"site": site, "layer": S.parse(site).layer, "basis": r.basis, "dtype": r.dtype,
                 "n_tokens": len(self.alignment), **r.summary} for site, r in self.results.items()]
        t = pd.DataFrame(recs).set_index("site").reindex(columns=TABLE_COLUMNS)
        g = self.growth.reindex(t.index)
        t["limit"], t["growth"] = g["limit"], g["growth"]
        t["passes"] = ~(g["error"] > g["limit"])  # NaN (not gated) compares False: passes
        return t

    @cached_property
    def growth(self) -> pd.DataFrame:
        """``divergence.growth`` over the gated sites (error, limit, upstream, jumps)."""
        gated = {s: r for s, r in self.results.items() if r.basis in GATED_BASES}
        err = pd.Series({s: _gated_error(s, r.summary) for s, r in gated.items()}, dtype=float)
        lim = pd.Series({s: self.tolerance.limit(s, r.dtype) for s, r in gated.items()}, dtype=float)
        return growth(err, lim, self.threshold)

    @cached_property
    def first_divergence(self) -> Divergence | None:
        """Earliest site whose error jumps beyond its inputs' (None when nothing diverges)."""
        return first_divergence(self.growth)

    @cached_property
    def diagnosis(self) -> list[Finding]:
        """Likely causes, in execution order (see ``aligntools.diagnosis``)."""
        return diagnose(self.growth, self.table, self.routing, self.per_token)


    def per_token(self, site: str) -> pd.DataFrame:
        """Token rows (request, position, token_id, step_a, step_b) + that site's metrics."""
        if site not in self.results:
            raise KeyError(f"site {site!r} was not compared; compared sites: {', '.join(self.results)}")
        return self.alignment.tokens.assign(**self.results[site].rows)

    def to_xarray(self) -> xr.Dataset:
        """Per-token metrics as a Dataset with dims (site, token); NaN where not applicable."""
        names = sorted({k for r in self.results.values() for k in r.rows})
        n = len(self.alignment)
        data = {k: (("site", "token"), np.stack([
            np.asarray(r.rows.get(k, np.full(n, np.nan)), dtype=np.float64) for r in self.results.values()
        ])) for k in names}
        tok = self.alignment.tokens
        coords = {"site": self.sites, "layer": ("site", [-1 if S.parse(s).layer is None else S.parse(s).layer
                                                         for s in self.sites])}
        coords.update({c: ("token", tok[c].to_numpy()) for c in tok.columns})
        return xr.Dataset(data, coords=coords)

    def plot(self, **kwargs):
        """Figure: layer-wise error growth curve + token x layer heatmap (``aligntools.plots``)."""
        from aligntools.plots import plot_comparison

        return plot_comparison(self, **kwargs)

    def summary(self, columns: list[str] | None = None) -> str:
        """Text report: table, disjoint sites, routing diff, first divergence, diagnosis, verdict."""
        cols = columns or ["basis", "dtype", "rel_l2", "max_abs", "cosine", "sqnr_db", "permille_err",
                           "ulp_max", "limit", "growth", "passes"]
        t = self.table
        t = t[[c for c in cols if c in t and t[c].notna().any()]]
        out = [f"{self.labels[1]} vs {self.labels[0]}: {len(self.alignment)} tokens "
               f"(align={self.alignment.mode}), {len(self.results)} sites",
               t.to_string(float_format=lambda x: f"{x:.3g}")]
        if "logits" in self.table.index and pd.notna(self.table.loc["logits", "kl_mean"]):
            lg = self.table.loc["logits"]
            out.append(f"logits: KL mean {lg['kl_mean']:.3g} max {lg['kl_max']:.3g}; |dlogprob| mean "
                       f"{lg['dlogprob_mean']:.3g} p99 {lg['dlogprob_p99']:.3g} max {lg['dlogprob_max']:.3g}; "
                       f"top-1 agreement {lg['top1_agree']:.1%}")
        for side, only in ((self.labels[0], self.only_a), (self.labels[1], self.only_b)):
            if only:
                out.append(f"only in {side} (not compared): {', '.join(only)}")
        notes = [f"{s}: {r.note}" for s, r in self.results.items() if r.note]
        for side, col in ((self.labels[0], "missing_a"), (self.labels[1], "missing_b")):
            miss = self.table[col][self.table[col] > 0]
            if len(miss):
                notes.append(f"tokens not captured in {side} (all-NaN rows, left out): "
                             + ", ".join(f"{s} {int(n)}" for s, n in miss.items()))
        if notes:
            out.append("notes: " + "; ".join(notes))
        if len(self.routing):
            out.append("routing diff:\n" + self.routing.to_string(float_format=lambda x: f"{x:.3g}"))
        out.append(str(self.first_divergence) if self.first_divergence else "no divergence")
        out.extend(f"  {f}" for f in self.diagnosis)
        out.append("PASS" if self.passes else f"FAIL: {', '.join(self.failures)}")
        return "\n".join(out)

    def __repr__(self) -> str:
        fd = self.first_divergence.site if self.first_divergence else None
        return (f"Comparison({len(self.results)} sites, {len(self.alignment)} tokens, "
                f"passes={self.passes}, first_divergence={fd!r})")


# Sites an engine may legitimately leave out for some tokens (the Tracker fills those rows
# with NaN): logits of prompt rows under ``generate``, logprobs of a token with no successor.
SPARSE_SITES = ("logits", "logprobs", "entropy")


def _gated_error(site: str, summary: dict) -> float:
    """rel_l2, or inf when values are non-finite on one side only. At every other site a row
    that is NaN on one side only is a NaN blow-up, not a missing row: it must fail."""
    one_sided = summary.get("missing_a", 0) + summary.get("missing_b", 0)
    if summary.get("nonfinite_mismatch", 0) > 0 or (one_sided > 0 and S.parse(site).kind not in SPARSE_SITES):
        return np.inf
    return summary["rel_l2"]
