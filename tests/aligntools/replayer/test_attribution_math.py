"""Attribution arithmetic on a synthetic gap function (no engine): shares, ranking, cumulative."""

from __future__ import annotations

import pytest

from aligntools.replayer.attribution import RESIDUAL, Attribution, run_attribution

# Additive toy: each misaligned knob adds its cost; 0.1 remains when all are aligned (dtype).
COST = {"rmsnorm": 0.5, "topk": 0.0, "lm_head_dtype": 0.3}
DIFFERING = {k: ("typical", "aligned") for k in COST}


def gap(changes: dict) -> float:
    return 0.1 + sum(c for k, c in COST.items() if k not in changes)


def test_shares_ranking_and_cumulative():
    table, g0, residual = run_attribution(gap, DIFFERING, progress=False)
    assert g0 == pytest.approx(0.9) and residual == pytest.approx(0.1)
    assert list(table.index) == ["rmsnorm", "lm_head_dtype", "topk", RESIDUAL]
    assert table.loc["rmsnorm", "share"] == pytest.approx(0.5 / 0.9)
    assert table.loc["lm_head_dtype", "gap_alone"] == pytest.approx(0.6)
    assert table.loc["topk", "share"] == 0.0
    assert list(table["gap_cumulative"].iloc[:3]) == pytest.approx([0.4, 0.1, 0.1])
    assert table.loc[RESIDUAL, "share"] == pytest.approx(0.1 / 0.9)


def test_a_knob_that_makes_it_worse_gets_zero_share_but_keeps_its_raw_gap():
    def worse(changes: dict) -> float:
        return gap(changes) + (0.2 if "topk" in changes else 0.0)

    table, g0, _ = run_attribution(worse, DIFFERING, progress=False)
    assert table.loc["topk", "share"] == 0.0
    assert table.loc["topk", "gain"] == pytest.approx(-0.2)
    assert table.index[-2] == "topk"  # ranked last


def test_attribution_object_ranks_and_plots():
    table, g0, residual = run_attribution(gap, DIFFERING, progress=False)
    a = Attribution(table, g0, residual, dtype="bfloat16", train="hf")
    assert a.ranked == ["rmsnorm", "lm_head_dtype", "topk"]
    assert "rmsnorm" in a.summary()
    fig = a.plot()
    assert len(fig.axes) == 2
