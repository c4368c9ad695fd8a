"""The pipeline timeline's x axis covers the spans, not the idle start-up before them.

A Ray run publishes weights once, then waits ~16 s for its actors to start before the first
rollout: drawn to scale, 16 of the axis's 22 s showed nothing.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from minirl.scale_out.timeline import Timeline, staleness_figure  # noqa: E402

T = 1_000.0  # wall-clock seconds of the first span
STARTUP = 16.0


def ray_like() -> Timeline:
    """One 0.3 s publish, STARTUP s of nothing, then three 2 s steps."""
    t = Timeline()
    t.add("sync", T, T + 0.3, 0)
    for k in range(3):
        b = T + 0.3 + STARTUP + 2 * k
        t.add("rollout", b, b + 1.2, k)
        t.add("reward", b + 1.2, b + 1.4, k)
        t.add("train", b + 1.4, b + 1.9, k)
        t.add("sync", b + 1.9, b + 2.0, k + 1)
    return t


def drawn_bars(ax) -> list[tuple[float, float]]:
    """(x start, x end) of every stage bar on ``ax``."""
    out = []
    for coll in ax.collections:
        for path in coll.get_paths():
            xs = path.vertices[:, 0]
            out.append((float(xs.min()), float(xs.max())))
    return out


def covered(bars: list[tuple[float, float]]) -> float:
    """Length of the union of ``bars``."""
    total, reach = 0.0, -float("inf")
    for lo, hi in sorted(bars):
        total += max(0.0, hi - max(lo, reach))
        reach = max(reach, hi)
    return total


def test_axis_spans_the_work_with_little_empty_margin():
    t = ray_like()
    fig = t.figure([(T - 5.0, 0), (T + 17.0, 4), (T + 40.0, 0)], title="ray")  # depth outside the spans too
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    bars = drawn_bars(ax)
    first, last = min(b[0] for b in bars), max(b[1] for b in bars)
    assert abs(first) < 1e-9  # the axis starts at the first span
    width = hi - lo
    assert (first - lo) / width < 0.02 and (hi - last) / width < 0.02  # margins: 1% each side
    busy = covered(bars) / width
    assert busy > 0.85, f"only {busy:.0%} of the x axis shows a busy stage"


def test_cut_is_labelled_and_ticks_read_wall_clock_seconds():
    fig = ray_like().figure(title="ray")
    ax = fig.axes[0]
    assert any(f"{STARTUP:.1f} s, no stage busy" in txt.get_text() for txt in ax.texts)
    assert "seconds" in ax.get_xlabel() and "cut" in ax.get_xlabel()
    fig.canvas.draw()
    labels = {float(x.get_text().replace("\u2212", "-")): x.get_position()[0]
              for x in ax.get_xticklabels() if x.get_text()}
    assert max(labels) > STARTUP  # ticks after the cut read the time since the first span
    rollout0 = min(b[0] for b in drawn_bars(ax) if b[0] > 0.3 + 1e-6)
    after = sorted((s, x) for s, x in labels.items() if s > STARTUP)
    (s1, x1), (s2, x2) = after[0], after[1]
    assert abs((x2 - x1) - (s2 - s1)) < 1e-6  # one second is one unit of x past the cut
    assert abs(rollout0 - (x1 - (s1 - (0.3 + STARTUP)))) < 1e-6  # the first rollout sits at 16.3 s


def test_a_run_without_idle_stretches_is_drawn_to_scale():
    t = Timeline()
    for k in range(4):
        t.add("rollout", T + k, T + k + 0.7, k)
        t.add("train", T + k + 0.7, T + k + 1.0, k)
    ax = t.figure().axes[0]
    assert not ax.texts
    lo, hi = ax.get_xlim()
    assert lo < 0 < 4.0 < hi < 4.1


def test_staleness_figure_shows_each_runs_shares():
    fig = staleness_figure({"sync": {0: 30}, "async": {0: 10, 1: 30}})
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == [0.0, 0.25, 0.75, 1.0]  # sync 100% fresh; async 25% fresh, 75% one update old
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sync", "async"]
