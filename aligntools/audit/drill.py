"""``mlab audit --drill``: from a numeric gap in a run's records down to the op that makes it.

Why: the fingerprint names the precision choice that reproduces the engine and the replay names the site
where minirl's engine computing that way first parts from the trainer; the op inside that site, and the
knob that sets it, is what a researcher changes. The replay's engine spec is what ``aligntools.drill``
takes, so the audit drills with the engine it already replayed, on the trainer's fp32 checkpoint, and holds
each op to float32's limits as the replay held each site.
"""

from __future__ import annotations

import os

from aligntools.audit.result import AuditResult

TRAIN = "hf:float32"
"""The trainer side, as the audit scores it."""


def drill_numeric(result: AuditResult, model: str | os.PathLike) -> str:
    """Drill into the site the numeric cause's replay picked (``replay["drill"]``) and keep the drill's
    verdict in that cause's detail (``drill``: site, why, first op, knob), so ``--json`` and ``--report``
    carry it. Returns the lines to print: the drill's table and verdict, or why there was nothing to drill."""
    from aligntools.audit.precision import trainer_limits
    from aligntools.drilldown.api import drill
    from aligntools.gates.inputs import UsageError

    numeric = next((c for c in result.causes if c.name == "numeric"), None)
    if numeric is None:
        return ("drill-down: nothing to drill, the records are aligned" if result.verdict == "aligned" else
                "drill-down: no numeric remainder to drill; the causes named above explain the gap")
    replayed = numeric.detail.get("replay")
    if not replayed:
        return ("drill-down: no precision choice minirl computes reproduces the numeric gap or matches its size "
                "(fingerprint), so there is no engine to drill with; mlab check --drill drills a spec you give")
    if "error" in replayed:
        return f"drill-down: minirl cannot run this model ({replayed['error']}), so it cannot drill it"
    target = replayed.get("drill")
    if target is None:
        return (f"drill-down: replayed as {replayed['engine']}, no layer's attention or MLP fails (first divergent "
                f"site {replayed['first_divergence']}); aligntools.replay replays that op")
    try:
        drilled = drill(model, target["site"], train=TRAIN, infer=replayed["engine"], tolerance=trainer_limits())
    except UsageError as e:
        return f"drill-down: {e}"
    first = drilled.first
    numeric.detail["drill"] = {**target, "first_op": None if first is None else str(first),
                               "knob": None if first is None else first.knob}
    why = f" ({target['why']})" if target["why"] else ""
    return f"drill-down with {replayed['engine']}, into {target['site']}{why}:\n{drilled}"
