"""What a person sees on the gate report (issue 15), checked on the HTML and the figures:
images scale to their column, the knob list wraps, attribution is a table with a word on
why shares need not sum to 100%, every chart has its own title, expert-id rows read
"exact"/"n/a", and tick labels are readable."""

from __future__ import annotations

import re

from aligntools.viz.plots import FONT, growth_curve
from tests.aligntools.viz.conftest import toy_attribution


def test_images_scale_and_long_text_wraps(report_html):
    html = report_html.read_text()
    css = html.split("<style>")[1].split("</style>")[0]
    assert re.search(r"figure img\{[^}]*max-width:100%", css)
    assert "white-space:pre-wrap" in css  # a long <pre> line wraps instead of widening the page


def test_knob_settings_are_a_wrapping_list(report_html, gate):
    html = report_html.read_text()
    knobs = html.split('<ul class="cols">')[1].split("</ul>")[0]
    assert knobs.count("<li>") == len(gate.setup["knobs"]) and "lm_head_dtype=" in knobs
    assert "inference knobs: " not in html  # no longer one 2,387 px <pre> line


def test_routing_id_rows_read_exact_or_na(report_html, gate):
    t = gate.site_table()
    ids = t[[s.endswith(".topk_ids") for s in t.index]]
    assert len(ids) and set(ids["rel_l2"]) <= {"exact", "n/a"} and set(ids["passes"]) == {"n/a"}
    cells = re.findall(r"<td>([^<]*)</td>", report_html.read_text())
    assert "nan" not in cells
    assert "nan" not in gate.summary().split()


def test_attribution_is_a_table_with_a_note_on_the_sum(report_html):
    html = report_html.read_text()
    section = html.split("Knob attribution (float32 trainer)")[1]
    assert "<th>share</th>" in section and "<td>30%</td>" in section
    assert "need not add up to 100%" in section and "knobs interact" in section


def test_every_chart_has_its_own_title(gate):
    figs = [*gate.figures().values(), toy_attribution("hf").plot(), toy_attribution("hf:bfloat16").plot()]
    titles = [ax.get_title() for f in figs for ax in f.axes if ax.get_title()]
    assert len(titles) == len(set(titles)) >= 6


def test_tick_labels_are_readable(gate):
    ax = growth_curve(gate.comparison).axes[0]
    assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= FONT >= 9


def test_growth_curve_names_the_largest_spike(gate):
    g = gate.comparison.growth
    jumps = g[g["jumps"] & (g["growth"] < float("inf"))]
    texts = [t.get_text() for t in growth_curve(gate.comparison).axes[0].texts]
    if len(jumps):
        assert any(t.startswith(jumps["growth"].idxmax()) for t in texts)


def test_growth_curve_marks_the_site_furthest_over_its_limit(gate):
    t = gate.table[gate.table["rel_l2"].notna()]
    worst = (t["rel_l2"] / t["limit"]).idxmax()
    labels = [line.get_label() for line in growth_curve(gate.comparison).axes[0].get_lines()]
    assert any(label.startswith(f"worst: {worst} (") and "x its limit)" in label for label in labels), labels


def test_a_long_verdict_table_shows_failing_rows_first_and_folds_the_rest():
    import pandas as pd

    from aligntools.viz.report import Report

    df = pd.DataFrame({"rel_l2": [0.1, 0.2, 0.3, 0.4]}, index=pd.Index(["a", "b", "c", "d"], name="site"))
    failed = pd.Series([False, True, True, True], index=df.index)
    html = Report("t").table(df, failed=failed, shown=2).render()
    shown, folded = html.split("<details>")
    assert "<td>b</td>" in shown and "<td>c</td>" in shown and "<td>a</td>" not in shown
    assert "2 more rows (1 failing, 1 passing)" in folded and "<td>a</td>" in folded and "<td>d</td>" in folded
    assert "<details>" not in Report("t").table(df, failed=failed).render()  # shown=None: one table, as before


def test_folded_rows_that_read_n_a_are_not_counted_as_passing():
    """The demo's "4 passing" counted topk_ids rows whose verdict reads n/a (gated in Routing)."""
    import pandas as pd

    from aligntools.viz.report import Report

    df = pd.DataFrame({"rel_l2": [0.3, 0.1, "n/a", "n/a"], "passes": [False, True, "n/a", "n/a"]},
                      index=pd.Index(["a", "b", "L0.topk_ids", "L1.topk_ids"], name="site"))
    failed = pd.Series([True, False, False, False], index=df.index)
    html = Report("t").table(df, failed=failed, shown=0).render()
    assert "4 more rows (1 failing, 1 passing, 2 n/a)" in html
