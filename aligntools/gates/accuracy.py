"""Accuracy gate for a kernel or module change: PyTorch Dynamo ``same()`` semantics per site.

Why against a reference and not candidate vs baseline: a new kernel may legitimately differ
from the old one by rounding; what must not happen is that it lands *further from the
truth* than the old one did. With a float64 (or fp32) ``reference`` run, a site fails when

    err(candidate vs reference) > k * err(baseline vs reference) + atol

(``err`` = relative L2, ``k``/``atol`` per dtype from ``aligntools.analyzer.tolerance``;
docs/conventions.md). A candidate that is *more* accurate than the baseline always passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aligntools.analyzer.comparison import compare
from aligntools.analyzer.comparison import GATED_BASES, SiteVerdict
from aligntools.analyzer.tolerance import Tolerance


@dataclass(frozen=True)
class GateReport(SiteVerdict):
    """Per site: ``err_candidate``, ``err_baseline`` (both vs reference), ``limit``, ``passes``, and
    ``note``: why a site that fails for lack of a comparison was not compared."""

    table: pd.DataFrame

    def __str__(self) -> str:
        verdict = "PASS" if self.passes else f"FAIL at {', '.join(self.failures)}"
        return self.table.to_string(float_format=lambda x: f"{x:.3g}") + "\n" + verdict


def accuracy_gate(candidate: Any, baseline: Any, reference: Any, *, tolerance: Tolerance | None = None,
                  sites: str | list[str] | None = None, align: str = "strict") -> GateReport:
    """Gate ``candidate`` against ``baseline``, both measured against ``reference``."""
    cand = compare(reference, candidate, sites=sites, align=align)
    base = compare(reference, baseline, sites=sites, align=align)
    rows = []
    for site, rc in cand.results.items():
        rb = base.results.get(site)
        unusable = [r.note for r in (rc, rb) if r is not None and not r.comparable]
        if unusable:  # nothing shows this site agrees: it fails (leave it out by name with sites=)
            rows.append({"site": site, "dtype": rc.dtype_b, "err_candidate": math.nan, "err_baseline": math.nan,
                         "limit": math.nan, "passes": False, "note": "not compared: " + "; ".join(unusable)})
            continue
        if rc.basis not in GATED_BASES or rb is None or rb.basis not in GATED_BASES:
            continue
        e_c, e_b = rc.summary["rel_l2"], rb.summary["rel_l2"]
        dtype = rc.dtype_b  # the candidate's own dtype sets k and atol
        limit = (tolerance or Tolerance()).rule(site, dtype).limit(e_b)
        nonfinite = rc.summary.get("nonfinite_mismatch", 0) > rb.summary.get("nonfinite_mismatch", 0)
        rows.append({"site": site, "dtype": dtype, "err_candidate": e_c, "err_baseline": e_b,
                     "limit": limit, "passes": bool(e_c <= limit and not nonfinite), "note": ""})
    if not rows:
        raise ValueError("no site to gate: candidate, baseline and reference share no float site")
    return GateReport(pd.DataFrame(rows).set_index("site"))


def assert_aligned(candidate: Any, baseline: Any, reference: Any, **kwargs: Any) -> GateReport:
    """``accuracy_gate`` that raises ``AssertionError`` listing the failing sites.

    Use in a user's CI when changing a kernel: ``assert_aligned(new_capture, old_capture,
    fp64_capture)``; returns the report when it passes.
    """
    report = accuracy_gate(candidate, baseline, reference, **kwargs)
    if not report.passes:
        bad = report.table.loc[report.failures]
        raise AssertionError("candidate is less accurate than baseline beyond tolerance "
                             "(err_candidate > k*err_baseline + atol):\n"
                             + bad.to_string(float_format=lambda x: f"{x:.3g}"))
    return report
