"""Notebook 02 §2: the reading says where the cumulative gap reaches 0, from the table (hand-made tables)."""

from __future__ import annotations

import pandas as pd

from labs.alignment_checklist import Checklist, bf16_reading, bf16_summary, closing_knobs


def checklist(alone: list[float], cumulative: list[float], baseline: float = 0.02) -> Checklist:
    knobs = [f"k{i}" for i in range(len(alone))]
    t = pd.DataFrame({"module": "MoE", "gap_alone": alone + [cumulative[-1]],
                      "share": [max(0.0, 1 - a / baseline) for a in alone] + [cumulative[-1] / baseline],
                      "gap_cumulative": cumulative + [cumulative[-1]]}, index=knobs + ["residual (dtype)"])
    return Checklist(t, baseline, cumulative[-1], figure=None)


def test_the_reading_names_the_knob_where_the_cumulative_gap_reaches_zero():
    cl = checklist([0.018, 0.017, 0.019, 0.02, 0.02], [0.015, 0.01, 0.0, 0.0, 0.0])
    assert closing_knobs(cl) == ["k0", "k1", "k2"]
    text = bf16_reading(cl)
    assert "reaches **0** after 3 of 5 knobs (`k0`, `k1`, `k2`) and stays 0 through the other 2" in text
    assert "bit-identical" in text and "none closes half the gap alone" in text
    assert "all-or-nothing" not in text and "only all of them" not in text
    assert bf16_summary(cl) == "no single knob closes more than 15% of the gap alone, and the cumulative gap reaches 0 after 3 of 5 knobs"


def test_a_gap_that_returns_after_zero_is_said_to_move_again():
    text = bf16_reading(checklist([0.018, 0.017, 0.019], [0.0, 0.004, 0.0]))
    assert "reaches **0** after 1 of 3 knobs (`k0`), then later knobs move it again (up to 0.004)" in text


def test_a_gap_that_never_reaches_zero_says_what_remains():
    cl = checklist([0.018, 0.005], [0.015, 0.003])
    assert closing_knobs(cl) == []
    assert "never bring the cumulative gap to 0: with all 2 aligned, 0.003 remains" in bf16_reading(cl)
    assert "none closes half" not in bf16_reading(cl)  # k1 alone removes 75 %
    assert bf16_summary(cl).endswith("all 2 knobs together leave 0.003")
