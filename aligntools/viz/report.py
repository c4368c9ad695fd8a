"""Self-contained HTML reports: one file with the table, the findings and the plots inside.

Why the layout rules (images at most their column wide, lists and long lines wrapping, wide
tables scrolling in their own box): the page must read on a laptop screen (1,400 px) without
sideways scrolling; the browser test in tests/aligntools/viz checks that.

Why one file with base64 PNGs instead of an HTML page next to image files: the report is a CI
artifact and an attachment to a bug report; it must survive being copied alone, opened
offline, and diffed by eye. It is written atomically (temporary sibling + rename) so a crashed
run never leaves a half-written report that looks like a finished one.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from aligntools.viz.tables import FingerprintLike, fingerprint_html

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1280px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em;overflow-wrap:anywhere}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
p,li{overflow-wrap:anywhere}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:.85em;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
tr.fail td{background:#fde8e8}
.verdict{font-size:1.2em;font-weight:bold;padding:.6em 1em;border-radius:4px}
.pass{background:#e5f6e5;color:#155d15}.failv{background:#fde8e8;color:#8a1414}
pre{background:#f7f7f7;padding:.6em;white-space:pre-wrap;overflow-wrap:anywhere}
ul.cols{columns:16em;font-size:.9em;font-family:ui-monospace,monospace}
figure{margin:1em 0}figure img{max-width:100%;height:auto}figcaption{color:#555;font-size:.9em}
details{margin:.5em 0}summary{cursor:pointer;color:#2c5d8a}
@media (max-width:1100px){figure{overflow-x:auto}figure img{max-width:none}}
"""
"""Below 1,100 px a figure keeps its drawn size and scrolls in its own box: shrunk to a 900 px
window, a 1,300 px figure's 10 pt labels were 6-7 px tall."""


class Report:
    """An HTML document built block by block: ``heading``, ``text``, ``table``, ``figure``.

    Blocks are escaped when added, so a site name or an error message can never break the page.
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._blocks: list[str] = []

    def heading(self, text: str, anchor: str | None = None) -> "Report":
        """A section title; ``anchor``: its id, the target of ``link``."""
        ident = f' id="{html.escape(anchor)}"' if anchor else ""
        self._blocks.append(f"<h2{ident}>{html.escape(text)}</h2>")
        return self

    def link(self, text: str, anchor: str) -> "Report":
        """A paragraph linking to the section whose heading has ``anchor``."""
        self._blocks.append(f'<p><a href="#{html.escape(anchor)}">{html.escape(text)}</a></p>')
        return self

    def text(self, text: str) -> "Report":
        self._blocks.append(f"<p>{html.escape(text)}</p>")
        return self

    def preformatted(self, text: str) -> "Report":
        self._blocks.append(f"<pre>{html.escape(text)}</pre>")
        return self

    def bullets(self, items: list[str]) -> "Report":
        """A list flowing in as many columns as fit (long settings lists wrap, never overflow)."""
        self._blocks.append('<ul class="cols">' + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>")
        return self

    def verdict(self, passed: bool, text: str) -> "Report":
        cls = "pass" if passed else "failv"
        self._blocks.append(f'<p class="verdict {cls}">{html.escape(text)}</p>')
        return self

    def table(self, df: pd.DataFrame, failed: pd.Series | None = None, float_format: str = "{:.3g}",
              formats: dict[str, str] | None = None, shown: int | None = None) -> "Report":
        """``df`` as an HTML table (index shown as the first column); rows where the boolean
        ``failed`` (aligned with ``df.index``) is True are shaded red. Boolean cells read
        ``pass`` / ``FAIL``: the tables here are verdict tables. NaN reads ``n/a``.
        ``formats``: column -> format of its float cells (e.g. ``{"share": "{:.0%}"}``).
        ``shown``: show the first ``shown`` failing rows (in ``df``'s order) and fold every other
        row into a ``<details>`` block, so a 53-row table does not push the plots off screen."""
        if shown is not None and shown < 0:
            raise ValueError(f"Report.table: shown={shown}; use a row count >= 0 or None to show every row")
        bad = (failed.reindex(df.index, fill_value=False).astype(bool) if failed is not None
               else pd.Series(False, index=df.index))
        if shown is None:
            self._blocks.append(self._table_html(df, bad, float_format, formats))
            return self
        top = df[bad].head(shown)
        rest = df.drop(index=top.index)
        self._blocks.append(self._table_html(top, bad, float_format, formats) if len(top) else
                            "<p>No row fails.</p>")
        if len(rest):
            summary = f"{len(rest)} more rows ({_counts(rest, bad[rest.index])})"
            self._blocks.append(f"<details><summary>{html.escape(summary)}</summary>"
                                f"{self._table_html(rest, bad, float_format, formats)}</details>")
        return self

    @staticmethod
    def _table_html(df: pd.DataFrame, bad: pd.Series, float_format: str, formats: dict[str, str] | None) -> str:
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in [df.index.name or "", *df.columns])
        fmts = [(formats or {}).get(c, float_format) for c in df.columns]
        rows = []
        for idx, row in df.iterrows():
            cells = [_cell(idx, float_format)] + [_cell(v, f) for v, f in zip(row.tolist(), fmts)]
            cls = ' class="fail"' if bool(bad.get(idx, False)) else ""
            rows.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table></div>")

    def fingerprint(self, fp: FingerprintLike) -> "Report":
        """A ``Fingerprint`` as its tables (closest setting, differing knobs, worst sites), the same
        HTML a notebook shows: its one-line repr printed raw was unreadable in the demo's report."""
        self._blocks.append(f'<div class="scroll">{fingerprint_html(fp)}</div>')
        return self

    def figure(self, fig, caption: str = "") -> "Report":
        """Embed a matplotlib figure as a base64 PNG (the figure itself is left open)."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._blocks.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">{cap}</figure>')
        return self

    def render(self) -> str:
        """The whole document as a string."""
        body = "\n".join(self._blocks)
        return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}</title>"
                f"<style>{_STYLE}</style></head><body><h1>{html.escape(self.title)}</h1>\n{body}\n</body></html>\n")

    def write(self, path: str | os.PathLike) -> Path:
        """Write atomically; an unwritable location raises OSError naming ``path``."""
        return write_atomic(path, self.render())


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary sibling and ``os.replace``.

    Only a new path or a regular file is replaced (``minirl.check_output_file``: never a device
    node, FIFO, socket, directory, or a capture). Raises ``OSError`` whose message names ``path``
    and the real reason (the CLI turns it into a usage error)."""
    from minirl import check_output_file, temp_sibling

    p = check_output_file(path, "report")
    fd, tmp = temp_sibling(p, "report")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write report to {p}: {e.strerror or e}") from e
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _counts(rows: pd.DataFrame, bad: pd.Series) -> str:
    """"2 failing, 8 passing, 2 n/a": a row passes only where its ``passes`` cell is True; one that reads
    anything else (``n/a``: an expert-id row, gated elsewhere) is counted apart, not as passing."""
    n_fail = int(bad.sum())
    verdicts = rows["passes"][~bad] if "passes" in rows.columns else pd.Series(True, index=rows.index[~bad])
    n_pass = int(sum(v is True or v is np.True_ for v in verdicts))
    n_na = len(rows) - n_fail - n_pass
    return f"{n_fail} failing, {n_pass} passing" + (f", {n_na} n/a" if n_na else "")


def _cell(value: object, float_format: str) -> str:
    if isinstance(value, bool):
        return "pass" if value else "<b>FAIL</b>"
    if isinstance(value, float):
        return "n/a" if value != value else html.escape(float_format.format(value))
    return html.escape(str(value))
