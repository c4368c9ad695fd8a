"""The HTML report is self-contained, escapes what it shows, and is written atomically."""

from __future__ import annotations

import base64
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from aligntools.viz.report import Report, write_atomic  # noqa: E402


def _report() -> Report:
    df = pd.DataFrame({"rel_l2": [1e-7, 3e-3], "passes": [True, False]},
                      index=pd.Index(["L0.q", "<L1.k>"], name="site"))
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    r = Report("gate & <report>").verdict(False, "MISALIGNED: x").table(df, failed=~df["passes"]).figure(fig, "curve")
    plt.close(fig)
    return r


def test_report_embeds_table_figure_and_escapes():
    html = _report().render()
    assert "gate &amp; &lt;report&gt;" in html and "<report>" not in html
    assert "&lt;L1.k&gt;" in html and "<b>FAIL</b>" in html
    assert html.count('<tr class="fail">') == 1  # only the failing row is shaded
    png = html.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "src=\"http" not in html and "<link" not in html  # nothing fetched from outside


def test_write_is_atomic_and_respects_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out = _report().write(tmp_path / "sub" / "r.html")
    finally:
        os.umask(old)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.html"]  # no temp file left
    assert out.stat().st_mode & 0o777 == 0o644  # an ordinary file, not mkstemp's 0600


def test_path_under_a_file_names_the_path(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="cannot write report to .*file/r.html"):
        write_atomic(tmp_path / "file" / "r.html", "x")
