"""Pipeline metrics: per-stage busy/idle spans and their plot (AsyncFlow Fig. 7/8 style).

Each stage (rollout worker, reward worker, trainer, weight sync) records ``(start, end, step)``
spans in wall-clock seconds (``time.time``, comparable across processes on one host). Idle time
is what the stage did not spend in a span between the run's first start and last end: the
pipeline bubbles the asynchronous workflow exists to remove (§4.2).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from collections.abc import Iterator, Mapping

import time
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator


@dataclass
class Timeline:
    spans: list[tuple[str, float, float, int]] = field(default_factory=list)  # (stage, start, end, step)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, stage: str, start: float, end: float, step: int) -> None:
        with self.lock:
            self.spans.append((stage, start, end, step))

    @contextmanager
    def span(self, stage: str, step: int) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.add(stage, start, time.time(), step)

    def busy_idle(self) -> dict[str, dict[str, float]]:
        """``{stage: {"busy": s, "idle": s, "utilization": busy / wall}}`` over the whole run."""
        if not self.spans:
            return {}
        t0, t1 = min(s[1] for s in self.spans), max(s[2] for s in self.spans)
        wall = max(t1 - t0, 1e-9)
        out = {}
        for stage in sorted({s[0] for s in self.spans}):
            busy = sum(e - b for name, b, e, _ in self.spans if name == stage)
            out[stage] = {"busy": busy, "idle": wall - busy, "utilization": busy / wall}
        return out

    def figure(self, depth: list[tuple[float, int]] | None = None, title: str = "pipeline") -> Figure:
        """One bar row per stage (colour = step), plus queue depth over time when given.

        The x axis runs from the first span's start to the last span's end (queue-depth samples
        outside that range are left out). A stretch where no stage is busy for longer than
        ``GAP_FRACTION`` of the run (Ray actors starting up after the first weight publish) is
        cut to a narrow hatched band labelled with its length: left in, it took 16 of a run's
        22 s of axis and squeezed the steps the plot is for into a corner. Tick labels stay
        seconds since the first span, read across the cut."""
        fig = Figure(figsize=(9, 3.5 if depth else 2.8))
        axes = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1]) if depth else [fig.add_subplot()]
        ax = axes[0]
        axis = _CutAxis.of(self.spans)
        stages = sorted({s[0] for s in self.spans}, reverse=True)
        colors = [f"C{i}" for i in range(10)]
        for row, stage in enumerate(stages):
            for name, b, e, step in self.spans:
                if name == stage:
                    ax.broken_barh([(axis.x(b), axis.x(e) - axis.x(b))], (row - 0.4, 0.8),
                                   color=colors[step % 10], alpha=0.85)
        ax.set_yticks(range(len(stages)), stages)
        ax.set_title(f"{title} (colour = step)")
        for a in axes:
            for lo, hi in axis.bands():
                a.axvspan(lo, hi, facecolor="none", edgecolor="0.6", hatch="//", lw=0)
        for (lo, hi), seconds in zip(axis.bands(), axis.cut_s):
            ax.text((lo + hi) / 2, (len(stages) - 1) / 2, f"{seconds:.1f} s, no stage busy", rotation=90,
                    ha="center", va="center", fontsize="x-small", bbox={"fc": "white", "ec": "none", "pad": 1})
        if depth:
            kept = [(t, d) for t, d in depth if axis.t0 <= t <= axis.t1]
            axes[1].step([axis.x(t) for t, _ in kept], [d for _, d in kept], where="post")
            axes[1].set_ylabel("in flight\n(samples)")
        axes[-1].set_xlabel("seconds since the first span (wall clock" + (", hatched: cut)" if axis.cut_s else ")"))
        axes[-1].xaxis.set_major_locator(FixedLocator(axis.ticks()))
        axes[-1].xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{axis.seconds(x):.3g}"))
        pad = 0.01 * max(axis.x(axis.t1), 1e-9)
        ax.set_xlim(-pad, axis.x(axis.t1) + pad)
        fig.tight_layout()
        return fig


GAP_FRACTION = 0.25
"""An all-idle stretch longer than this share of the run is cut from the timeline's axis."""
CUT_WIDTH = 0.04
"""Width of a cut stretch on the axis, as a share of the run's busy (uncut) seconds."""


@dataclass(frozen=True)
class _CutAxis:
    """Wall-clock seconds -> x position, with long all-idle stretches cut to a narrow band."""

    t0: float
    t1: float
    gaps: tuple[tuple[float, float], ...]  # (start, end) of each cut stretch, wall clock
    width: float  # x width each cut stretch is drawn with

    @classmethod
    def of(cls, spans: list[tuple[str, float, float, int]]) -> _CutAxis:
        if not spans:
            return cls(0.0, 0.0, (), 0.0)
        t0, t1 = min(s[1] for s in spans), max(s[2] for s in spans)
        gaps, reach = [], t0
        for _, b, e, _ in sorted(spans, key=lambda s: s[1]):
            if b - reach > GAP_FRACTION * (t1 - t0):
                gaps.append((reach, b))
            reach = max(reach, e)
        kept = (t1 - t0) - sum(e - b for b, e in gaps)
        return cls(t0, t1, tuple(gaps), CUT_WIDTH * kept)

    @property
    def cut_s(self) -> list[float]:
        return [e - b for b, e in self.gaps]

    def x(self, t: float) -> float:
        """Position of wall-clock time ``t`` (inside a cut, linearly within its band)."""
        x = t - self.t0
        for b, e in self.gaps:
            if t >= e:
                x -= (e - b) - self.width
            elif t > b:
                x -= (t - b) * (1 - self.width / (e - b))
        return x

    def seconds(self, x: float) -> float:
        """Inverse of ``x``, minus ``t0``: what a tick at ``x`` reads."""
        t = x + self.t0
        for b, e in self.gaps:
            lo = self.x(b)
            if x >= lo + self.width:
                t += (e - b) - self.width
            elif x > lo:
                t += (x - lo) * ((e - b) / self.width - 1)
        return t - self.t0

    def ticks(self) -> list[float]:
        """Round seconds within each uncut stretch, at their x positions."""
        edges = [self.t0, *[t for gap in self.gaps for t in gap], self.t1]
        total = max(self.x(self.t1), 1e-9)
        out = []
        for lo, hi in zip(edges[::2], edges[1::2]):
            bins = max(1, round(8 * (self.x(hi) - self.x(lo)) / total))
            out += [self.x(self.t0 + v) for v in MaxNLocator(bins).tick_values(lo - self.t0, hi - self.t0)
                    if lo - self.t0 - 1e-9 <= v <= hi - self.t0 + 1e-9]
        return out

    def bands(self) -> list[tuple[float, float]]:
        return [(self.x(b), self.x(b) + self.width) for b, _ in self.gaps]


def staleness_figure(histograms: Mapping[str, Mapping[int, int]]) -> Figure:
    """Share of trained tokens by staleness (learner version minus the version that sampled
    them), one bar group per staleness and one bar per run: the evidence behind "at most one
    update old" (AsyncFlow §4.2.2). Shares, not counts, so runs of different sizes compare."""
    fig = Figure(figsize=(5, 2.8))
    ax = fig.add_subplot()
    keys = sorted({k for h in histograms.values() for k in h})
    width = 0.8 / max(len(histograms), 1)
    for i, (name, h) in enumerate(histograms.items()):
        total = sum(h.values()) or 1
        ax.bar([j + (i - (len(histograms) - 1) / 2) * width for j in range(len(keys))],
               [h.get(k, 0) / total for k in keys], width, label=name)
    ax.set_xticks(range(len(keys)), [str(k) for k in keys])
    ax.set_xlabel("staleness (updates behind the learner)")
    ax.set_ylabel("share of tokens trained")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
