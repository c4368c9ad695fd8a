"""``mlab check`` offers the drill: its diagnosis names the drill-down of the first divergent
site, ``--drill`` prints it and the report links to it."""

from __future__ import annotations

from types import SimpleNamespace

from aligntools.drilldown.gate import hint, summary_lines
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


def _gate(site: str | None, drilled: object = None) -> SimpleNamespace:
    fd = SimpleNamespace(site=site) if site else None
    return SimpleNamespace(first_divergence=fd, setup={"model": "/m"}, drilldown=drilled)


def test_without_drill_the_summary_says_how_to_drill_where_a_drill_can_open_the_site():
    assert summary_lines(_gate("L3.attn_out")) == [hint(_gate("L3.attn_out"))]
    assert "add --drill" in hint(_gate("L3.attn_out")) and "'L3.attn_out'" in hint(_gate("L3.attn_out"))
    assert hint(_gate("L3.attn_norm")) is None and hint(_gate(None)) is None  # a norm: aligntools.replay
    assert summary_lines(_gate("L3.q", drilled="the table")) == ["the table"]
