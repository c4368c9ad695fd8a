"""Gates: the alignment gate (train vs infer engine), the accuracy gate (a kernel or module
change vs a reference) and its pytest plugin, and the engine specs both take. The names are
imported on first use (``aligntools._lazy``): ``mlab check`` reads and validates its arguments
through ``aligntools.gates.inputs`` before torch, pandas and xarray load, so a mistyped path is
named in about a second, not after ~4-9 s of imports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aligntools._lazy import exports

_EXPORTS = {"GateReport": "aligntools.gates.accuracy", "accuracy_gate": "aligntools.gates.accuracy",
            "assert_aligned": "aligntools.gates.accuracy", "GateResult": "aligntools.gates.alignment",
            "check_alignment": "aligntools.gates.alignment", "GateUsageError": "aligntools.gates.inputs"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # what type checkers and IDEs see
    from aligntools.gates.accuracy import GateReport, accuracy_gate, assert_aligned
    from aligntools.gates.alignment import GateResult, check_alignment
    from aligntools.gates.inputs import GateUsageError
