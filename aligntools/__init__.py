"""aligntools: capture, compare and gate train-inference numerical alignment.

Subpackages by concept: ``tracker`` (capture), ``adapters`` (one per engine), ``analyzer``
(compare), ``replayer`` (replay, attribution), ``gates`` (CI gates), ``viz`` (plots, widgets,
report), ``cli``; ``sites`` is the vocabulary they share. Importing aligntools stays light: the
names below are imported on first use (``aligntools._lazy``), and nnsight, minirl, vllm and sglang
only by the adapters that need them, when a target of theirs is captured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aligntools._lazy import exports

_EXPORTS = {"Comparison": "aligntools.analyzer", "Tolerance": "aligntools.analyzer", "compare": "aligntools.analyzer",
            "GateResult": "aligntools.gates", "assert_aligned": "aligntools.gates", "check_alignment": "aligntools.gates",
            "Attribution": "aligntools.replayer", "ReplayResult": "aligntools.replayer", "attribute": "aligntools.replayer",
            "replay": "aligntools.replayer",
            "Fingerprint": "aligntools.replayer.fingerprint", "fingerprint": "aligntools.replayer.fingerprint",
            "Capture": "aligntools.tracker", "CaptureBudgetExceeded": "aligntools.tracker",
            "CaptureFileError": "aligntools.tracker", "Tracker": "aligntools.tracker", "capture": "aligntools.tracker",
            "explore": "aligntools.viz", "plot_comparison": "aligntools.viz",
            "DrillResult": "aligntools.drilldown", "drill": "aligntools.drilldown",
            # subpackages, not in __all__ (no public name shadows a submodule): aligntools.audit is itself
            # callable, aligntools.audit(records, model); aligntools.records.read(path)
            "audit": "aligntools.audit", "records": "aligntools.records"}
__all__ = sorted(k for k in _EXPORTS if k not in ("audit", "records"))
__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # what type checkers and IDEs see
    from aligntools import audit, records
    from aligntools.analyzer import Comparison, Tolerance, compare
    from aligntools.drilldown import DrillResult, drill
    from aligntools.gates import GateResult, assert_aligned, check_alignment
    from aligntools.replayer import Attribution, ReplayResult, attribute, replay
    from aligntools.replayer.fingerprint import Fingerprint, fingerprint
    from aligntools.tracker import Capture, CaptureBudgetExceeded, CaptureFileError, Tracker, capture
    from aligntools.viz import explore, plot_comparison
