"""Tables people read: numbers formatted the way the prose quotes them (%, ‰, 2 significant digits).

Why not ``DataFrame.style``: a Styler has no text/plain form, so headless runs, exported
notebooks and the tests that read a table's text would see ``<Styler object>``. ``formatted``
returns a DataFrame of strings, which renders everywhere; ``fingerprint_html`` is the HTML a
``Fingerprint`` shows in Jupyter instead of its one-line repr.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Protocol

import pandas as pd


class FingerprintLike(Protocol):
    """What ``fingerprint_html`` reads of ``aligntools.replayer.fingerprint.Fingerprint`` (viz may not
    import the replayer: docs/architecture.md's import rules)."""

    distance: float
    table: pd.DataFrame
    explained: pd.DataFrame
    gap_start: str | None
    evaluated: int


def formatted(df: pd.DataFrame, formats: Mapping[str, str]) -> pd.DataFrame:
    """``df`` with each column in ``formats`` rendered by its format string ("{:.2f}‰", "{:.0%}");
    other columns unchanged. Unknown columns are an error naming them and the available ones."""
    unknown = sorted(set(formats) - set(df.columns))
    if unknown:
        raise KeyError(f"formatted: no column(s) {unknown} in the table; columns are {list(df.columns)}")
    out = df.copy()
    for col, fmt in formats.items():
        out[col] = [fmt.format(v) for v in df[col]]
    return out


def fingerprint_html(fp: FingerprintLike, sites: int = 8) -> str:
    """The closest minirl setting, its distance, the knobs that differ from stock transformers and the
    ``sites`` worst sites of ``fp.table`` (rel-L2 vs the engine per setting) as an HTML block."""
    knobs = "".join(f"<tr><td><code>{html.escape(str(k))}</code></td><td>{html.escape(str(r['engine_value']))}</td>"
                    f"<td>{html.escape(str(r['trainer_value']))}</td><td>{r['distance_if_reverted']:.2g}</td></tr>"
                    for k, r in fp.explained.iterrows())
    worst = fp.table.sort_values("best", ascending=False).head(sites)
    rows = "".join(f"<tr><td><code>{html.escape(str(s))}</code></td>"
                   + "".join(f"<td>{v:.2e}</td>" for v in r.to_numpy(float)) + "</tr>"
                   for s, r in worst.iterrows())
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in worst.columns)
    gap = (f"remaining gap starts at <code>{html.escape(fp.gap_start)}</code>" if fp.gap_start
           else "no site left with a gap")
    return (f"<div><b>Fingerprint</b>: closest minirl setting is {fp.distance:.3g} mean |Δ logprob| away; "
            f"{gap}; {fp.evaluated} settings tried."
            + (f"<table><tr><th>knob</th><th>engine</th><th>transformers</th><th>distance if reverted</th></tr>"
               f"{knobs}</table>" if knobs else "<p>No knob differs from stock transformers.</p>")
            + f"<table><tr><th>site (worst {len(worst)})</th>{head}</tr>{rows}</table></div>")
