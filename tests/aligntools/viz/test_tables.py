"""aligntools.viz.tables: formatted numbers in a plain DataFrame, and a Fingerprint as HTML."""

from __future__ import annotations

import pandas as pd
import pytest

from aligntools.replayer.fingerprint import Fingerprint
from aligntools.viz.tables import fingerprint_html, formatted


def test_formatted_renders_units_and_keeps_other_columns():
    df = pd.DataFrame({"tokens": [512, 4096], "masked": [3.4123, 0.0]}, index=[0.0, 0.5])
    out = formatted(df, {"masked": "{:.2f}‰"})
    assert out["masked"].tolist() == ["3.41‰", "0.00‰"] and out["tokens"].tolist() == [512, 4096]
    assert "3.41‰" in out.to_string() and df["masked"].iloc[0] == 3.4123  # the input is left alone


def test_formatted_names_an_unknown_column():
    with pytest.raises(KeyError, match=r"no column\(s\) \['nope'\].*columns are \['a'\]"):
        formatted(pd.DataFrame({"a": [1.0]}), {"nope": "{:.1f}"})


def test_fingerprint_html_is_a_table_not_a_repr():
    table = pd.DataFrame({"hf_exact": [1e-3, 2e-2, 0.0], "typical": [2e-3, 1e-2, 0.0], "best": [1e-4, 5e-3, 0.0]},
                         index=["embed", "logits", "L0.q"])
    explained = pd.DataFrame({"engine_value": ["fused_add"], "trainer_value": ["hf"], "distance_if_reverted": [0.031],
                              "score_if_reverted": [1.0]}, index=pd.Index(["rmsnorm"], name="knob"))
    fp = Fingerprint(knobs=None, distance=0.0123, score=0.5, table=table, explained=explained, gap_start="logits",
                     evaluated=7)
    html = fingerprint_html(fp, sites=2)
    assert "0.0123 mean |Δ logprob|" in html and "<code>logits</code>" in html and "7 settings tried" in html
    assert "<td><code>rmsnorm</code></td><td>fused_add</td><td>hf</td>" in html and "<td>0.031</td>" in html
    assert html.count("<code>logits</code>") == 2 and "L0.q" not in html  # the 2 worst sites, worst first
    assert html.index("<code>logits</code></td>") < html.index("<code>embed</code>") and "Fingerprint(" not in html
