"""``routing_lab.replay_figure`` bins the data it is given, with exact zeros in a bin of their own."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from labs.routing_lab import BINS_PER_DECADE, ReplayResult, log_bins, replay_figure  # noqa: E402


def result(r3_zeros: int = 0) -> ReplayResult:
    """Gaps spread over 1e-6..1e-1, as a real run's are; R3 reproduces ``r3_zeros`` tokens exactly."""
    rng = np.random.default_rng(0)
    none = 10 ** rng.uniform(-6, -1, 200)
    r3 = none / 10
    r3[:r3_zeros] = 0.0
    per_token = pd.DataFrame({"no replay": none, "R2": none, "R3": r3})
    summary = pd.DataFrame({"reduction": [1.0, 1.0, none.mean() / r3.mean()]}, index=["no replay", "R2", "R3"])
    return ReplayResult(per_token, summary, pd.Series(dtype=float))


def counts(ax) -> list[np.ndarray]:
    """Per drawn histogram: the heights of its bins (step outlines: every other vertex)."""
    return [p.get_path().vertices[1:-1:2, 1] for p in ax.patches]


def test_bins_cover_the_data_decades_only():
    res = result()
    ax = replay_figure(res).axes[0]
    lo, hi = ax.get_xlim()
    data = res.per_token.to_numpy()
    assert data.min() / 10 <= lo <= data.min() and data.max() <= hi <= data.max() * 10  # within a decade
    assert [t.get_text() for t in ax.get_xticklabels()][0] != "0"  # no zero bin without zeros
    assert all(c.sum() == 200 for c in counts(ax))  # every token lands in a bin


def test_exact_zeros_get_their_own_labelled_bin():
    res = result(r3_zeros=25)
    ax = replay_figure(res).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "0" and all(lab.startswith("1e") for lab in labels[1:])
    zero_bin = [c[0] for c in counts(ax)]
    assert zero_bin == [0, 0, 25]  # only R3 has exact zeros, all of them in the first bin
    assert all(c.sum() == 200 for c in counts(ax))


def test_log_bins_edges():
    edges, zero_at = log_bins(np.array([3e-6, 0.05, np.nan]))
    assert zero_at is None and edges[0] == 1e-6 and abs(edges[-1] - 0.1) < 1e-12
    assert len(edges) == 5 * BINS_PER_DECADE + 1
    edges, zero_at = log_bins(np.array([0.0, 2e-3]))
    assert edges[1] == 1e-3 and edges[0] < zero_at < edges[1]
