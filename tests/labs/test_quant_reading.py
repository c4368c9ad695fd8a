"""Notebook 04's quantized-rollout section: its figure and its computed paragraph
(``labs.quant_lab.format_figure`` / ``reading``), and the claims check that reads them back."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import nbformat  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from nbformat.v4 import new_code_cell, new_notebook, new_output  # noqa: E402

from aligntools.viz.tables import formatted  # noqa: E402
from labs import narrate, quant_lab  # noqa: E402
from tests.labs.test_notebook_outputs import check_04_quant_claims  # noqa: E402

FORMATS = ["none", "fp8_e4m3", "int8", "int4"]


def table(mean=(0.0056, 0.0101, 0.0054, 0.033), masked=(0.0, 0.0, 0.0, 0.0), flips=(0.004, 0.009, 0.003, 0.05),
          tokens: int = 256) -> pd.DataFrame:
    """``quant_lab.measure``'s columns, values chosen per test."""
    return pd.DataFrame({"tokens": tokens, "abs_dlogp_mean": mean, "abs_dlogp_max": [10 * m for m in mean],
                         "mismatch_kl_k3": 1e-5, "icepop_masked_permille": masked, "tis_capped_permille": 0.0,
                         "flip_rate": flips}, index=pd.Index(FORMATS, name="weights"))


def test_gap_claims_follow_the_ratio_to_bf16():
    md = quant_lab.reading(table())
    assert "fp8_e4m3's gap (0.01) is of the same order as bf16 alone (0.0056)" in md  # 1.8x: within 3x
    assert "int4's gap (0.033) is 6x larger than bf16 alone (0.0056)" in md
    assert "Over 256 sampled tokens per format" in md


def test_masked_share_is_claimed_only_above_its_noise():
    quiet = quant_lab.reading(table(masked=(0.0, 3.9, 0.0, 0.0)))  # 1 of 256 tokens: inside 2 s.e. (7.8‰)
    assert "no share above its binomial noise under any format (at most 3.9‰)" in quiet
    assert "(not one token)" in quant_lab.reading(table())
    assert "for all but a few tokens even with int4's weights" in quiet
    loud = quant_lab.reading(table(masked=(0.0, 3.9, 0.0, 289.0)))
    assert "IcePop masks 289.0‰ of the tokens under int4 (above Ring-1T's 1-2‰)" in loud
    assert "no share above its binomial noise under bf16 weights, fp8_e4m3, int8" in loud


def test_routing_sentence_names_the_format_with_most_flips_and_is_left_out_for_dense_models():
    md = quant_lab.reading(table())
    assert "under int4 5.00% of (position, MoE layer) pairs pick another top-k set" in md and "0.40%" in md
    dense = quant_lab.reading(table(flips=(math.nan,) * 4))
    assert "Routing" not in dense


def test_format_figure_panels():
    t = table(masked=(0.0, 3.9, 0.0, 289.0))
    gap, masked = quant_lab.format_figure(t).axes
    assert gap.get_yscale() == "log"
    assert list(gap.lines[0].get_ydata()) == list(t["abs_dlogp_mean"])
    assert gap.lines[1].get_ydata()[0] == t.loc["none", "abs_dlogp_mean"]  # the bf16 floor line
    heights = [p.get_height() for p in masked.patches if p.get_width() < 1]
    assert heights == list(t["icepop_masked_permille"])
    assert masked.get_ylim()[1] >= 289.0 + narrate.share_noise(289.0, 256)  # the error bar fits


def notebook(t: pd.DataFrame, md: str) -> nbformat.NotebookNode:
    """Cells tagged like notebook 04's section 3, with ``t`` and ``md`` as their outputs."""
    shown = formatted(t[["tokens", "abs_dlogp_mean", "abs_dlogp_max", "icepop_masked_permille", "tis_capped_permille",
                         "flip_rate"]],
                      {"abs_dlogp_mean": "{:.2g}", "abs_dlogp_max": "{:.2g}", "icepop_masked_permille": "{:.2f}‰",
                       "tis_capped_permille": "{:.2f}‰", "flip_rate": "{:.2%}"})
    data = {"text/plain": shown.to_string(), "image/png": "iVBORw0KGgo="}
    return new_notebook(cells=[
        new_code_cell("x", metadata={"tags": ["quant-rollouts"]}, outputs=[new_output("display_data", data=data)]),
        new_code_cell("y", metadata={"tags": ["quant-reading"]},
                      outputs=[new_output("display_data", data={"text/markdown": md, "text/plain": "<Markdown>"})])])


@pytest.mark.parametrize("masked", [(0.0, 0.0, 0.0, 0.0), (0.0, 3.9, 0.0, 289.0)])
def test_claims_check_accepts_the_generated_paragraph(masked):
    t = table(masked=masked)
    check_04_quant_claims(notebook(t, quant_lab.reading(t)))


def test_claims_check_catches_a_paragraph_that_contradicts_the_table():
    t = table()
    wrong = quant_lab.reading(t).replace("is 6x larger than", "is of the same order as")
    with pytest.raises(AssertionError):
        check_04_quant_claims(notebook(t, wrong))
    stale = quant_lab.reading(table(masked=(0.0, 0.0, 0.0, 289.0)))  # paragraph of another run
    with pytest.raises(AssertionError):
        check_04_quant_claims(notebook(t, stale))
