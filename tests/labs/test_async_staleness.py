"""``AsyncComparison.staleness`` / ``stale_share``: notebook 09's staleness figure and sentence."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

from labs.async_lab import AsyncComparison  # noqa: E402


def comparison() -> AsyncComparison:
    runs = {"sync": {0: 48}, "async": {0: 16, 1: 32}}
    return AsyncComparison({m: SimpleNamespace(staleness_hist=h) for m, h in runs.items()}, {})


def test_stale_share_counts_tokens_older_than_the_learner():
    assert comparison().stale_share() == {"sync": 0.0, "async": 32 / 48}


def test_staleness_figure_has_one_bar_per_mode_and_staleness():
    ax = comparison().staleness().axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sync", "async"]
    assert sorted(round(p.get_height(), 4) for p in ax.patches) == [0.0, 0.3333, 0.6667, 1.0]
