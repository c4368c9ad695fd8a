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
from collections.abc import Iterator

import time
from matplotlib.figure import Figure


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
        """One bar row per stage (colour = step), plus queue depth over time when given."""
        fig = Figure(figsize=(9, 3.5 if depth else 2.8))
        axes = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1]) if depth else [fig.add_subplot()]
        ax = axes[0]
        t0 = min((s[1] for s in self.spans), default=0.0)
        stages = sorted({s[0] for s in self.spans}, reverse=True)
        colors = [f"C{i}" for i in range(10)]
        for row, stage in enumerate(stages):
            for name, b, e, step in self.spans:
                if name == stage:
                    ax.broken_barh([(b - t0, e - b)], (row - 0.4, 0.8), color=colors[step % 10], alpha=0.85)
        ax.set_yticks(range(len(stages)), stages)
        ax.set_title(f"{title} (colour = step)")
        if depth:
            axes[1].step([t - t0 for t, _ in depth], [d for _, d in depth], where="post")
            axes[1].set_ylabel("in flight")
        axes[-1].set_xlabel("seconds")
        fig.tight_layout()
        return fig


def staleness_figure(histogram: dict[int, int]) -> Figure:
    """Trained tokens by staleness (learner version minus the version that sampled them)."""
    fig = Figure(figsize=(4, 2.8))
    ax = fig.add_subplot()
    keys = sorted(histogram)
    ax.bar([str(k) for k in keys], [histogram[k] for k in keys])
    ax.set_xlabel("staleness (updates)")
    ax.set_ylabel("tokens trained")
    fig.tight_layout()
    return fig
