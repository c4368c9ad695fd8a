"""aligntools: capture, compare and gate train-inference numerical alignment.

Subpackages by concept: ``tracker`` (capture), ``adapters`` (one per engine), ``analyzer``
(compare), ``replayer`` (replay, attribution), ``gates`` (CI gates), ``viz`` (plots, widgets,
report), ``cli``; ``sites`` is the vocabulary they share. Importing aligntools stays light:
nnsight, minirl, vllm and sglang are imported only by the adapters that need them, when a
target of theirs is captured.
"""

from aligntools.analyzer import Comparison, Tolerance, compare
from aligntools.gates import GateResult, assert_aligned, check_alignment
from aligntools.replayer import Attribution, ReplayResult, attribute, replay
from aligntools.replayer.fingerprint import Fingerprint, fingerprint
from aligntools.tracker import Capture, CaptureBudgetExceeded, CaptureFileError, Tracker, capture
from aligntools.viz import explore, plot_comparison

__all__ = ["Attribution", "Capture", "CaptureBudgetExceeded", "CaptureFileError", "Comparison", "GateResult",
           "ReplayResult", "Tolerance", "Tracker", "assert_aligned", "attribute", "capture", "check_alignment",
           "compare", "explore", "plot_comparison", "replay"]
__all__ += ["Fingerprint", "fingerprint"]
from aligntools.drilldown import DrillResult, drill  # noqa: E402
__all__ += ["DrillResult", "drill"]
# Subpackages, not in __all__ (no public name shadows a submodule): aligntools.audit is itself callable,
# aligntools.audit(records, model), so importing it never rebinds a function; aligntools.records.read(path).
from aligntools import audit, records  # noqa: E402, F401
