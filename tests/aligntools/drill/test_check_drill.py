"""``mlab check`` offers the drill: its diagnosis names the drill-down of the first divergent
site, ``--drill`` prints it and the report links to it."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from aligntools.analyzer.divergence import first_divergence, growth
from aligntools.drilldown.gate import Target, hint, summary_lines, target
from labs.cli import main


def test_check_drill_prints_the_planted_op_and_the_report_links_to_it(moe, tmp_path, capsys):
    report = tmp_path / "gate.html"
    rc = main(["check", "--model", str(moe), "--infer", "minirl:aligned,router_dtype=bfloat16", "--tokens", "32",
               "--drill", "--report", str(report)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "first divergence at L0.router_logits" in out
    assert "drill-down of L0.router_logits" in out and "first divergent op gemm (router)" in out
    assert "knob: router_dtype" in out
    page = report.read_text()
    assert 'href="#drill-down"' in page and 'id="drill-down"' in page
    assert page.index('href="#drill-down"') < page.index('id="drill-down"')  # from the diagnosis, down to it


def _gate(errors: dict[str, float], limit: float = 1e-3, drilled: object = None) -> SimpleNamespace:
    """A gate over per-site errors (execution order), judged by the Analyzer's own growth rule."""
    g = growth(pd.Series(errors), pd.Series(limit, index=list(errors)))
    comparison = SimpleNamespace(growth=g, first_divergence=first_divergence(g))
    return SimpleNamespace(comparison=comparison, first_divergence=comparison.first_divergence,
                           setup={"model": "/m"}, drilldown=drilled)


CLEAN = {"embed": 0.0, "L0.attn_norm": 0.0, "L0.q": 0.0, "L0.attn_out": 0.0, "L0.mlp_norm": 0.0, "L0.mlp_out": 0.0,
         "L0.resid_post": 0.0, "L1.attn_norm": 0.0, "L1.attn_out": 0.0, "L1.mlp_out": 0.0, "L1.resid_post": 0.0}


def test_a_divergent_module_is_drilled_itself():
    gate = _gate({**CLEAN, "L0.attn_out": 0.02, "L0.mlp_out": 0.02, "L0.resid_post": 0.02, "L1.attn_norm": 0.02,
                  "L1.attn_out": 0.02, "L1.mlp_out": 0.02, "L1.resid_post": 0.02})
    assert target(gate) == Target("L0.attn_out")
    assert summary_lines(gate) == [hint(gate)] and "add --drill" in hint(gate) and "'L0.attn_out'" in hint(gate)
    assert summary_lines(_gate(CLEAN, drilled="the table")) == ["the table"]


def test_past_a_site_the_drill_cannot_open_the_first_jumping_module_is_drilled():
    bf16_embed = {s: 4e-3 for s in CLEAN}  # the embedding's rounding carries everywhere...
    gate = _gate({**bf16_embed, "L1.mlp_out": 0.05, "L1.resid_post": 0.05})  # ...and L1's MLP jumps
    assert gate.first_divergence.site == "embed"
    t = target(gate)
    assert t.site == "L1.mlp_out" and "embed diverges first" in t.why
    assert "the ops inside L1.mlp_out (" in hint(gate)


def test_when_no_module_jumps_the_one_that_grows_its_inputs_error_most_is_drilled():
    gate = _gate({**{s: 4e-3 for s in CLEAN}, "L0.attn_out": 6e-3, "L1.mlp_out": 9e-3, "L1.resid_post": 9e-3})
    t = target(gate)
    assert t.site == "L1.mlp_out" and "x2.25" in t.why, t  # 9e-3 over its inputs' 4e-3; L0.attn_out only x1.5
    assert target(_gate({**CLEAN, "embed": 5e-3}, limit=1e-2)) is None  # nothing fails: nothing to drill
    assert hint(_gate(CLEAN)) is None and summary_lines(_gate(CLEAN)) == []
