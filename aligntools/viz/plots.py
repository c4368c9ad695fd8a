"""Figures of a Comparison: layer-wise error growth and a token x layer heatmap.

Why ``matplotlib.figure.Figure`` and never pyplot: figures must render headless (CI, the
notebook runner) and be returned as data (labs return figures, never only show them);
a bare Figure needs no backend and displays inline in Jupyter all the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from aligntools import sites as S

if TYPE_CHECKING:
    from aligntools.analyzer.comparison import Comparison

_TINY = 1e-30
FONT = 10
"""Tick and legend font size (points): at 100 dpi a figure is shown about 1:1 in the report's
column, where matplotlib's small defaults (7 pt site names) were unreadable."""


def growth_curve(cmp: Comparison, metric: str = "rel_l2", ax: Axes | None = None) -> Figure:
    """``metric`` per site in execution order (log y), tolerance limits dashed, the first
    divergence marked: where the error takes off is visible at a glance."""
    fig, ax = _fig_ax(ax)
    t = cmp.table[cmp.table[metric].notna()]
    x = np.arange(len(t))
    v = t[metric].to_numpy(float)
    shown = [v[v > 0]] + ([t["limit"].to_numpy(float)] if metric == "rel_l2" else [])
    # exact zeros sit on the bottom edge, a decade under the smallest error or limit shown, so
    # they do not stretch the axis over 30 empty decades
    floor = np.nanmin(np.concatenate(shown)) / 10 if np.concatenate(shown).size else _TINY
    y = np.maximum(v, floor)
    ax.semilogy(x, y, ".-", lw=1, label=metric)
    if (v == 0).any():
        ax.semilogy(x[v == 0], y[v == 0], "v", color="green", label="exactly 0")
    if metric == "rel_l2":
        ax.semilogy(x, t["limit"].to_numpy(float), "--", color="gray", lw=1, label="limit")
    ax.set_ylim(bottom=floor / 1.5)
    fd = cmp.first_divergence
    if fd is not None and fd.site in t.index:
        i = list(t.index).index(fd.site)
        ax.semilogy([i], [y[i]], "o", color="red", ms=9, mfc="none", label=f"first divergence: {fd.site}")
    worst = _worst(t, metric)
    if worst is not None:
        i = list(t.index).index(worst)
        what = (f"{t.loc[worst, metric] / t.loc[worst, 'limit']:.3g}x its limit" if metric == "rel_l2"
                else f"{metric} {t.loc[worst, metric]:.3g}")
        ax.semilogy([i], [y[i]], "s", color="#8e44ad", ms=10, mfc="none", label=f"worst: {worst} ({what})")
    g = cmp.growth
    spikes = g[g["jumps"] & np.isfinite(g["growth"])]["growth"].reindex(t.index).dropna()
    if len(spikes):  # the largest jump over its inputs, named where the eye lands
        top = spikes.idxmax()
        i = list(t.index).index(top)
        ax.annotate(f"{top} x{spikes[top]:.3g}", (i, y[i]), xytext=(6, 0),
                    textcoords="offset points", fontsize=FONT, va="center")
    # one tick per layer start and the head: neighbouring labels (embed, final_norm) would overlap
    ticks = [i for i, s in enumerate(t.index) if S.parse(s).kind in ("attn_norm", "logits")]
    ax.set_xticks(ticks, [t.index[i] for i in ticks], rotation=60, ha="right", fontsize=FONT)
    ax.set_ylabel(metric)
    ax.set_title(f"error growth ({cmp.labels[1]} vs {cmp.labels[0]})")
    ax.legend(fontsize=FONT)
    return fig


def _worst(t, metric: str) -> str | None:
    """The site the gate's verdict quotes as worst: furthest over its limit (``rel_l2``), else the
    largest ``metric``; None when no site has a finite value."""
    score = t[metric] / t["limit"] if metric == "rel_l2" and "limit" in t else t[metric]
    score = score[np.isfinite(score.to_numpy(float))]
    return score.idxmax() if len(score) else None


def token_matrix(cmp: Comparison, sites: list[str], metric: str = "rel_l2") -> np.ndarray:
    """[tokens, len(sites)] per-token ``metric`` (NaN where a site lacks it)."""
    n = len(cmp.alignment)
    cols = [np.asarray(cmp.results[s].rows.get(metric, np.full(n, np.nan)), float) for s in sites]
    return np.stack(cols, axis=1) if cols else np.zeros((n, 0))


BADNESS: dict[str, tuple[str, object]] = {
    "cosine": ("1 − cosine similarity", lambda v: 1.0 - v),
    "sqnr_db": ("−SQNR (dB)", lambda v: -v),
}
"""Metrics where a larger value means *better*, mapped so that a larger value means worse (label,
transform): every heatmap reads the same way, bright = worse, as the notebooks teach."""


def badness(mat: np.ndarray, metric: str) -> tuple[np.ndarray, str]:
    """``mat`` transformed so that larger is worse, and the colour bar's label."""
    label, transform = BADNESS.get(metric, (metric, None))
    return (transform(mat) if transform else mat), label


def colour_norm(values: np.ndarray) -> Normalize:
    """Log colours whenever the finite values are non-negative and not all equal (exact zeros then
    drawn in the darkest colour): errors are ratios, and on a linear scale a few bright tokens
    turned the demo's heatmap nearly all black. Linear for signed values: −SQNR is negative (and
    raw cosines near 1 are never shown, ``badness`` turns them into 1 − cosine)."""
    v = values[np.isfinite(values)]
    pos = v[v > 0]
    if pos.size and (v >= 0).all() and pos.max() > pos.min():
        return LogNorm(vmin=pos.min(), vmax=pos.max())
    lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
    return Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1.0)


def _heatmap(cmp: Comparison, sites: list[str], labels: list[str], metric: str, ax: Axes | None,
             xlabel: str, title: str) -> Figure:
    fig, ax = _fig_ax(ax)
    mat, label = badness(token_matrix(cmp, sites, metric), metric)
    if not np.isfinite(mat).any():
        ax.text(0.5, 0.5, f"no {metric} to show", ha="center", va="center")
        ax.set_title(title)
        return fig
    norm = colour_norm(mat)
    nonneg = (mat[np.isfinite(mat)] >= 0).all()
    shown = np.where(mat > 0, mat, np.nan) if nonneg else mat  # exact zeros / inf SQNR: masked
    cmap = colormaps["magma"].with_extremes(bad=colormaps["magma"](0.0))  # exact (0, inf SQNR): darkest
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", norm=norm, cmap=cmap)
    ax.set_xticks(range(len(labels)), labels, rotation=60 if len(labels) > 8 else 0, fontsize=FONT)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("token (request:position)")
    tok = cmp.alignment.tokens
    step = max(1, len(tok) // 12)
    ax.set_yticks(range(0, len(tok), step),
                  [f"{r}:{p}" for r, p in zip(tok["request"][::step], tok["position"][::step])], fontsize=FONT)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=f"{label} (bright = worse)")
    return fig


def token_heatmap(cmp: Comparison, kind: str = "resid_post", metric: str = "rel_l2",
                  ax: Axes | None = None) -> Figure:
    """Tokens x layers image of the per-token ``metric`` at ``L*.{kind}`` (bright = worse), so
    errors confined to some tokens (decode steps, one request) stand out."""
    layers = sorted(S.parse(s).layer for s in cmp.results
                    if S.parse(s).kind == kind and S.parse(s).layer is not None)
    return _heatmap(cmp, [f"L{i}.{kind}" for i in layers], [str(i) for i in layers], metric, ax,
                    "layer", f"{metric} at L*.{kind}")


def layer_heatmap(cmp: Comparison, layer: int, metric: str = "rel_l2", ax: Axes | None = None) -> Figure:
    """Tokens x sites of one layer: inside a layer, which site the error starts at."""
    sites = [s for s in cmp.results if S.parse(s).layer == layer and cmp.results[s].basis != "ids"]
    return _heatmap(cmp, sites, [S.parse(s).kind for s in sites], metric, ax, "site",
                    f"{metric} in layer {layer}")


def plot_comparison(cmp: Comparison, kind: str = "resid_post", metric: str = "rel_l2") -> Figure:
    """Growth curve (left) and token x layer heatmap (right) in one Figure."""
    fig = Figure(figsize=(13, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    growth_curve(cmp, metric, ax=left)
    token_heatmap(cmp, kind, metric, ax=right)
    return fig


def _fig_ax(ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    return fig, fig.subplots()
