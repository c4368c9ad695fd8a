"""The alignment gate's way into the drill: its diagnosis names the drill-down of the first
divergent site (the command, or the drill itself when ``mlab check --drill`` ran it).

Why here and not in the gate: the gate only asks for lines and a report section, so what a
drill can open and how to call it stay in one package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aligntools.drilldown.windows import module_of

if TYPE_CHECKING:
    from aligntools.gates.alignment import GateResult
    from aligntools.viz.report import Report

ANCHOR = "drill-down"


def drillable(site: str | None) -> bool:
    """Whether ``aligntools.drill`` opens ``site``'s module (a layer's attention or MLP/MoE)."""
    try:
        return site is not None and bool(module_of(site))
    except ValueError:
        return False


def hint(gate: GateResult) -> str | None:
    """One line: how to see the ops inside the first divergent site (None: nothing to drill)."""
    fd = gate.first_divergence
    if fd is None or not drillable(fd.site):
        return None
    return (f"drill-down: the ops inside {fd.site}: add --drill to this mlab check, or "
            f"aligntools.drill({gate.setup['model']!r}, {fd.site!r}, train=..., infer=...) with the same engine specs")


def summary_lines(gate: GateResult) -> list[str]:
    """What ``GateResult.summary`` prints after the diagnosis: the drill, else the hint."""
    drilled = getattr(gate, "drilldown", None)
    if drilled is not None:
        return [str(drilled)]
    line = hint(gate)
    return [line] if line else []


def report_section(r: Report, gate: GateResult) -> Report:
    """The report's drill-down section (anchor ``#drill-down``, linked from the diagnosis)."""
    drilled, line = getattr(gate, "drilldown", None), hint(gate)
    if drilled is None and line is None:
        return r
    r.heading("Drill-down: the first divergent op", anchor=ANCHOR)
    if drilled is None:
        return r.text(line)
    r.text(str(drilled.first) if drilled.first else "no op jumps above its inputs' error")
    table = drilled.table.assign(jumps=drilled.table["jumps"].map({True: "first", False: ""}))
    return r.table(table, failed=drilled.table["jumps"])


def diagnosis_link(r: Report, gate: GateResult) -> Report:
    """The diagnosis' link to the drill-down section, when there is one."""
    fd = gate.first_divergence
    if getattr(gate, "drilldown", None) is None and hint(gate) is None:
        return r
    return r.link(f"Drill-down: the ops inside {fd.site} (first divergent op and the knob that aligns it)", ANCHOR)


def drill_first_divergence(gate: GateResult, model: str, train: str, infer: str, dtype: str | None) -> str | None:
    """``mlab check --drill``: drill into the gate's first divergent site and attach the result
    to ``gate`` (its summary and report then show it). Returns why it did not (None: it did)."""
    from aligntools.drilldown.api import drill
    from aligntools.gates.inputs import UsageError

    fd = gate.first_divergence
    if fd is None:
        return "drill-down: no divergent site to drill into"
    if not drillable(fd.site):
        return (f"drill-down: {fd.site} is not a module the drill opens (a layer's attention or MLP/MoE); "
                f"aligntools.replay replays its op")
    try:
        gate.drilldown = drill(model, fd.site, train=train, infer=infer, dtype=dtype)
    except UsageError as e:
        return f"drill-down: {e}"
    return None
