"""What the mismatch monitor's readings say: one sentence and one figure, computed from ``metrics.nc``.

Why a fitted slope: one reading is noisy (a probe of a few dozen tokens, stats-mode bounds), so
"the error grew" is said only when a least-squares line through every reading moves beyond its own
95 % interval (Student t on the slope's standard error); otherwise the sentence says the change is
within the noise. Errors are fitted on a log scale (they grow by factors), routing flips on a linear
one (a share of tokens). Every number in the sentence comes from the run's arrays
(``tests/minirl/training/test_monitor_report.py`` builds growing, flat and shrinking ones).
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from minirl.training.student_t import t_quantile

if TYPE_CHECKING:  # xarray and matplotlib load on first use
    import xarray as xr
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Trend:
    """A line ``a + b * step`` through the finite readings, its ends and whether it beats its noise."""

    first: float  # fitted value at the first step
    last: float  # fitted value at the last step
    low: float  # the 95 % interval of ``last - first``
    high: float
    n: int

    @property
    def real(self) -> bool:
        """The change's 95 % interval excludes 0: beyond the noise of the readings."""
        return self.n >= 3 and (self.low > 0 or self.high < 0)


def trend(steps: np.ndarray, values: np.ndarray) -> Trend | None:
    """Least-squares line through the finite ``values``; None with fewer than 2 readings or one step."""
    ok = np.isfinite(values)
    x, y = np.asarray(steps, dtype=np.float64)[ok], np.asarray(values, dtype=np.float64)[ok]
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    b, a = np.polyfit(x, y, 1)
    span = float(x.max() - x.min())
    half = math.inf
    if len(x) >= 3:
        resid = y - (a + b * x)
        se = math.sqrt(float(resid @ resid) / (len(x) - 2) / float(((x - x.mean()) ** 2).sum()))
        half = t_quantile(0.975, len(x) - 2) * se * span
    change = b * span
    return Trend(float(a + b * x.min()), float(a + b * x.max()), change - half, change + half, len(x))


def median_growth(ds: xr.Dataset, kind: str | None = None) -> Trend | None:
    """Trend of the median relative error (log scale) over every site, or over the sites of one
    ``kind`` (``attn_out``: every layer's attention output): one number per run to compare runs by,
    where ``sentence`` names the site that moved most. Per kind because sites of one kind move alike
    and kinds do not: stats-mode readings of a deep residual stream swing ~10x between readings
    where attention outputs move by percents (docs/runs.md). None: no such site, or 1 reading."""
    rel = ds["monitor_rel_l2"] if kind is None else of_kind(ds, kind)
    if not rel.sizes["site"]:
        return None
    return trend(ds["monitor_step"].values, np.log(rel.median("site").values))


def site_kinds(ds: xr.Dataset) -> list[str]:
    """The kinds of site the readings hold (``attn_out``, ``mlp_out``...), in execution order."""
    return list(dict.fromkeys(_kind(s) for s in ds["site"].values))


def of_kind(ds: xr.Dataset, kind: str) -> xr.DataArray:
    """``monitor_rel_l2`` [monitor_step, site] of the sites of one kind (none: an empty site axis)."""
    return ds["monitor_rel_l2"].sel(site=[s for s in ds["site"].values if _kind(s) == kind])


def _layer(site: object) -> str:
    """``"L3.attn_out"`` -> ``"L3"``; a site outside the layers (``embed``) is its own name."""
    return str(site).split(".", 1)[0]


def _kind(site: object) -> str:
    return str(site).rsplit(".", 1)[-1]  # "L3.attn_out" -> "attn_out" (docs/sites.md)


def compare_growth(runs: dict[str, xr.Dataset], kind: str | None = None) -> str:
    """How each run's median site error (over one ``kind`` of site, or all) changed (factor and 95 %
    interval), and a verdict: one run's gap moved faster than another's only where its change lies
    beyond the other's interval."""
    if len(runs) < 2:
        raise ValueError(f"compare_growth compares two or more runs; got {len(runs)}")
    what = f"median {kind} error" if kind else "median site error"
    fits = {name: median_growth(ds, kind) for name, ds in runs.items()}
    if any(f is None or f.n < 3 for f in fits.values()):
        return f"too few monitor readings of the {what} to compare the runs (3 or more each)"
    said = ", ".join(f"{math.exp(f.last - f.first):.2g}× {name} (95 % interval {math.exp(f.low):.2g}–"
                     f"{math.exp(f.high):.2g}×)" for name, f in fits.items())
    ranked = sorted(fits.items(), key=lambda kv: kv[1].last - kv[1].first, reverse=True)
    (top, t), (bottom, b) = ranked[0], ranked[-1]
    if t.low > b.high:
        moved = "grew faster" if t.last > t.first else "shrank less"
        verdict = f"the gap {moved} {top} than {bottom}"
    else:
        verdict = "the intervals overlap: no run's gap moved measurably faster than another's"
    return f"the {what} changed {said}; {verdict}"


def kinds_figure(runs: dict[str, xr.Dataset]) -> Figure:
    """One panel per kind of site (``site_kinds``): each run's median relative error over that
    kind's sites at every reading, log scale: how ``compare_growth``'s lines look."""
    from matplotlib.figure import Figure

    kinds = list(dict.fromkeys(k for ds in runs.values() for k in site_kinds(ds)))
    fig = Figure(figsize=(4 * len(kinds), 3.6), layout="constrained")
    for ax, kind in zip(np.atleast_1d(fig.subplots(1, len(kinds), sharex=True)), kinds):
        for name, ds in runs.items():
            rel = of_kind(ds, kind)
            if rel.sizes["site"]:
                ax.plot(ds["monitor_step"].values, rel.median("site").values, marker="o", label=name)
        ax.set(yscale="log", xlabel="RL step", title=f"median {kind} error", ylabel="relative L2, engine vs trainer")
        ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def load(path: str | os.PathLike) -> xr.Dataset:
    """A run's ``metrics.nc``, refused by name when it holds no monitor readings."""
    from minirl.training.run_log import load as load_log

    ds = load_log(path)
    if "monitor_rel_l2" not in ds:
        raise ValueError(f"{path} holds no mismatch monitor readings: the run had monitor_every: 0; run it with "
                         f"monitor_every: N (e.g. 10) to read the trainer against the engine every N steps")
    check(ds, path)
    return ds.sortby("monitor_step") if (np.diff(ds["monitor_step"].values) < 0).any() else ds


def check(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """Refuse, naming what is wrong, a monitor log no monitor could have written: a variable
    missing, readings that are not numbers, no site, an error below 0 or a routing-flip share
    outside [0, 1]. NaN and inf are readings (an engine that blew up), not damage."""
    for name in ("monitor_first_divergence", "monitor_step", "site"):
        if name not in ds.variables:
            raise ValueError(f"{path}: not a complete monitor log: no {name}")
    if not ds.sizes["site"]:
        raise ValueError(f"{path}: the log has no site: the monitor read none (monitor_sites matched no site)")
    for name, low, high in (("monitor_rel_l2", 0.0, math.inf), ("monitor_routing_flips", 0.0, 1.0)):
        if name not in ds:
            continue
        values = ds[name].values
        if values.dtype.kind not in "fiu":
            raise ValueError(f"{path}: {name} must be numbers; got {values.dtype} values such as "
                             f"{values.flat[0]!r}: the log is damaged")
        with np.errstate(invalid="ignore"):
            out = (values < low) | (values > high)
        if out.any():
            i, j = np.argwhere(out)[0]
            raise ValueError(f"{path}: {name} holds {int(out.sum())} values outside [{low:g}, {high:g}] "
                             f"({values[i, j]:g} at step {ds['monitor_step'].values[i]}): no monitor writes "
                             f"such a reading; the log is damaged")


def sentence(ds: xr.Dataset) -> str:
    """The run's mismatch in one sentence: the site whose error changed most, the layer whose
    routing flips changed most, and where the first divergence went."""
    steps = ds["monitor_step"].values
    span = f"from step {steps[0]} to {steps[-1]}"
    blown = _nonfinite(ds)
    if len(steps) < 3:
        which = f"{len(steps)} readings ({span}) are" if len(steps) > 1 else f"1 reading (step {steps[0]}) is"
        parts = [blown, f"{which} too few to tell a trend from noise (3 or more: lower monitor_every or run longer)",
                 _divergence(ds, bool(blown))]
    else:
        parts = [blown, _errors(ds, span, bool(blown)), _flips(ds), _divergence(ds, bool(blown))]
    return "; ".join(p for p in parts if p) + "."


def _nonfinite(ds: xr.Dataset) -> str:
    """The readings whose error is NaN or inf, named first: an engine whose outputs blew up gives
    them, the worst case there is (a fit, which skips them, would read it as clean). '' for none."""
    rel = ds["monitor_rel_l2"].values
    bad = ~np.isfinite(rel)
    if not bad.any():
        return ""
    steps, sites = ds["monitor_step"].values, [str(s) for s in ds["site"].values]
    hit = [sites[j] for j in np.flatnonzero(bad.any(axis=0))]
    kinds = " and ".join(k for k, m in (("NaN", np.isnan(rel)), ("inf", np.isinf(rel))) if m.any())
    named = ", ".join(hit[:3]) + (f" and {len(hit) - 3} more sites" if len(hit) > 3 else "")
    which = "every reading is" if bad.all() else f"{int(bad.sum())} of {bad.size} readings are"
    return (f"{which} not finite ({kinds}; {named}, first at step {steps[np.flatnonzero(bad.any(axis=1))[0]]}): "
            f"the engine's or the trainer's outputs blew up, the worst mismatch, not a clean one")


def _errors(ds: xr.Dataset, span: str, blown: bool) -> str:
    """The site whose finite error changed most (``blown``: non-finite readings are said apart)."""
    steps, rel = ds["monitor_step"].values, ds["monitor_rel_l2"].values
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(rel > 0, np.log(rel), np.nan)
    fits = {str(s): t for s, t in zip(ds["site"].values, (trend(steps, logs[:, j]) for j in range(rel.shape[1])))
            if t is not None}
    if not fits:
        return "" if blown else f"no site had a nonzero error in 3 readings {span}"
    real = {s: t for s, t in fits.items() if t.real}
    site, t = max((real or fits).items(), key=lambda kv: abs(kv[1].last - kv[1].first))
    factor = math.exp(t.last - t.first)
    band = f"95 % interval {math.exp(t.low):.2g}–{math.exp(t.high):.2g}×"
    if not real:
        return f"no site's error changed beyond its noise {span} (largest: {site}, {factor:.2g}×, {band})"
    verb = f"grew {factor:.2g}×" if factor > 1 else f"shrank to {factor:.2g}×"
    return f"{site}'s error {verb} {span} ({band})"


def _flips(ds: xr.Dataset) -> str:
    if "monitor_routing_flips" not in ds:
        return ""
    steps, flips = ds["monitor_step"].values, ds["monitor_routing_flips"].values
    fits = {int(i): t for i, t in zip(ds["layer"].values, (trend(steps, flips[:, j]) for j in range(flips.shape[1])))
            if t is not None}
    if not fits:
        return ""
    real = {i: t for i, t in fits.items() if t.real}
    layer, t = max((real or fits).items(), key=lambda kv: abs(kv[1].last - kv[1].first))
    ends = f"{100 * max(t.first, 0.0):.2g} % to {100 * max(t.last, 0.0):.2g} %"
    if not real:
        return f"routing flips stayed within their noise (most change: L{layer}, {ends} on the fitted line)"
    return f"routing flips in L{layer} {'rose' if t.last > t.first else 'fell'} from {ends}"


def _divergence(ds: xr.Dataset, blown: bool = False) -> str:
    """Where the first divergence was and went. A site of a layer the log has no readings of is said
    to be one (router sites have no error readings of their own, so the layer is what can be checked)."""
    steps = ds["monitor_step"].values
    layers = {_layer(s) for s in ds["site"].values}
    where = [(s if _layer(s) in layers else f"{s} (a layer this log has no readings of)") if (s := str(v)) else
             "none" for v in ds["monitor_first_divergence"].values]
    if all(w == "none" for w in where):
        return ("no first divergence was named (a non-finite error passes no limit test)" if blown else
                "no site diverged beyond the noise floor")
    if len(where) == 1:
        return f"first divergence at {where[0]} at step {steps[0]}"
    if where[-1] == where[0]:
        moved = " (it moved in between)" if len(set(where)) > 1 else ""
        return f"first divergence at {where[0]} from step {steps[0]} to {steps[-1]}{moved}"
    since = len(where) - 1
    while since > 0 and where[since - 1] == where[-1]:
        since -= 1
    return f"first divergence moved from {where[0]} to {where[-1]} at step {steps[since]}"


def figure(ds: xr.Dataset) -> Figure:
    """Left: site x monitor step heatmap of log10 relative error (bright = worse), each step's first
    divergence marked, a NaN or inf reading written in red in its cell (a blank one is a zero error);
    right, for a model with MoE layers: routing flips per layer. The sentence is the title."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    steps, sites = ds["monitor_step"].values, [str(s) for s in ds["site"].values]
    rel = ds["monitor_rel_l2"].values
    moe = "monitor_routing_flips" in ds
    fig = Figure(figsize=(13 if moe else 9, max(4.0, 0.22 * len(sites) + 1.8)), layout="constrained")
    heat, lines = fig.subplots(1, 2, width_ratios=[1.6, 1]) if moe else (fig.subplots(), None)
    with np.errstate(divide="ignore", invalid="ignore"):
        shown = np.log10(np.where((rel > 0) & np.isfinite(rel), rel, np.nan)).T  # [site, step]
    image = heat.imshow(shown, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=heat, label="log10 relative L2 error, engine vs trainer (bright = worse)")
    for j, i in np.argwhere(~np.isfinite(rel)):  # a blown-up reading: named in its cell, not left blank
        heat.text(j, i, "NaN" if np.isnan(rel[j, i]) else "inf", color="red", ha="center", va="center",
                  fontsize="x-small", fontweight="bold")
    for j, site in enumerate(ds["monitor_first_divergence"].values):
        if str(site) in sites:
            heat.plot(j, sites.index(str(site)), marker="x", color="cyan", markersize=8, mew=2)
    heat.set_xticks(range(len(steps)), [str(s) for s in steps], rotation=90 if len(steps) > 12 else 0)
    heat.set_yticks(range(len(sites)), sites, fontsize="small")
    heat.set(xlabel="RL step", title="error per site (x: first divergence)" if moe else
             "error per site (x: first divergence; a dense model: no routing)")
    if moe:
        for j, layer in enumerate(ds["layer"].values):
            lines.plot(steps, 100 * ds["monitor_routing_flips"].values[:, j], marker=".", label=f"L{layer}")
        lines.legend(fontsize="small")
        lines.set(xlabel="RL step", ylabel="probe tokens whose top-k expert set changed (%)", title="routing flips")
        lines.xaxis.set_major_locator(MaxNLocator(integer=True))
        lines.grid(alpha=0.3)
    fig.suptitle("\n".join(textwrap.wrap(sentence(ds), 150 if moe else 105)), fontsize="medium")
    return fig
