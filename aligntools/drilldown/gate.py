"""The alignment gate's way into the drill: its diagnosis names the drill-down of the first
divergent site the drill can open (the command, or the drill itself when ``mlab check --drill``
ran it).

Why "can open" and not just the first divergence: the drill opens a layer's attention or
MLP/MoE module, while a bf16 engine's first divergence is often ``embed`` (the table rounded
to bf16) or a norm. Then the next place worth opening is the first *module* whose error jumps,
or, when the embedding's error carries everywhere and no module jumps, the failing module that
grows its inputs' error the most.

Why here and not in the gate: the gate only asks for lines and a report section, so what a
drill can open and how to call it stay in one package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aligntools.drilldown.windows import module_of

if TYPE_CHECKING:
    from aligntools.analyzer.comparison import Comparison
    from aligntools.gates.alignment import GateResult
    from aligntools.viz.report import Report

ANCHOR = "drill-down"


@dataclass(frozen=True)
class Target:
    """The site a drill opens for a gate, and why that one when it is not the first divergence."""

    site: str
    why: str = ""

    def __str__(self) -> str:
        return f"{self.site} ({self.why})" if self.why else self.site


def drillable(site: str | None) -> bool:
    """Whether ``aligntools.drill`` opens ``site``'s module (a layer's attention or MLP/MoE)."""
    try:
        return site is not None and bool(module_of(site))
    except ValueError:
        return False


def target(gate: GateResult) -> Target | None:
    """The site to drill for a gate (``target_in`` its comparison)."""
    return target_in(gate.comparison)


def target_in(comparison: Comparison) -> Target | None:
    """The site to drill: the first jumping site the drill opens; else the failing site it opens
    whose error grows most over its inputs'; None when no module it opens fails."""
    g = comparison.growth  # per site, execution order: error, limit, growth, jumps
    opens = g[[drillable(s) for s in g.index]]
    fd = comparison.first_divergence
    jumping = opens.index[opens["jumps"].astype(bool)]
    if len(jumping):
        site = jumping[0]
        why = "" if fd is not None and site == fd.site else (
            f"the first divergent site the drill opens; {fd.site} diverges first" if fd is not None else "")
        return Target(site, why)
    failing = opens[opens["error"] > opens["limit"]]
    if failing.empty:
        return None
    site = failing["growth"].idxmax()
    first = f"{fd.site} diverges first and " if fd is not None else ""
    return Target(site, f"{first}no module the drill opens jumps; {site} grows its inputs' error most, "
                        f"x{failing.loc[site, 'growth']:.3g}")


def hint(gate: GateResult) -> str | None:
    """One line: how to see the ops inside the site worth drilling (None: nothing to drill)."""
    t = target(gate)
    if t is None:
        return None
    return (f"drill-down: the ops inside {t}: add --drill to this mlab check, or "
            f"aligntools.drill({gate.setup['model']!r}, {t.site!r}, train=..., infer=...) with the same engine specs")


def summary_lines(gate: GateResult) -> list[str]:
    """What ``GateResult.summary`` prints after the diagnosis: the drill, else the hint."""
    drilled = getattr(gate, "drilldown", None)
    if drilled is not None:
        return [str(drilled)]
    line = hint(gate)
    return [line] if line else []


def report_section(r: Report, gate: GateResult) -> Report:
    """The report's drill-down section: the drill (anchor ``#drill-down``, linked from the diagnosis), else the hint."""
    drilled, line = getattr(gate, "drilldown", None), hint(gate)
    if drilled is None and line is None:
        return r
    if drilled is None:  # a hint, which no link points at: no anchor (a report may hold several)
        return r.heading("Drill-down: the first divergent op").text(line)
    r.heading("Drill-down: the first divergent op", anchor=ANCHOR)
    r.text(str(drilled.first) if drilled.first else "no op jumps above its inputs' error")
    table = drilled.table.assign(jumps=drilled.table["jumps"].map({True: "first", False: ""}))
    return r.table(table, failed=drilled.table["jumps"])


def diagnosis_link(r: Report, gate: GateResult) -> Report:
    """The diagnosis' link to the drill-down section, only when a drill ran: without one the section
    holds a hint of how to run it, and a link promising "the first divergent op" led to no result."""
    drilled = getattr(gate, "drilldown", None)
    if drilled is None:
        return r
    return r.link(f"Drill-down: the ops inside {drilled.site} (first divergent op and the knob that aligns it)", ANCHOR)


def drill_first_divergence(gate: GateResult, model: str, train: str, infer: str, dtype: str | None) -> str | None:
    """``mlab check --drill``: drill into the site ``target`` picks and attach the result to
    ``gate`` (its summary and report then show it). Returns a line to print: why it did not
    drill, or why it drilled a site other than the first divergence (None: nothing to add)."""
    from aligntools.drilldown.api import drill
    from aligntools.gates.inputs import UsageError

    t = target(gate)
    if t is None:
        fd = gate.first_divergence
        return ("drill-down: no divergent site to drill into" if fd is None else
                f"drill-down: {fd.site} is not a module the drill opens (a layer's attention or MLP/MoE) and no "
                f"module it opens fails; aligntools.replay replays its op")
    try:
        gate.drilldown = drill(model, t.site, train=train, infer=infer, dtype=dtype)
    except UsageError as e:
        return f"drill-down: {e}"
    return f"drill-down: drilled {t}" if t.why else None
