"""Gates: the alignment gate (train vs infer engine), the accuracy gate (a kernel or module
change vs a reference) and its pytest plugin, and the engine specs both take."""

from aligntools.gates.accuracy import GateReport, accuracy_gate, assert_aligned
from aligntools.gates.alignment import GateResult, check_alignment
from aligntools.gates.inputs import GateUsageError

__all__ = ["GateReport", "GateResult", "GateUsageError", "accuracy_gate", "assert_aligned", "check_alignment"]
