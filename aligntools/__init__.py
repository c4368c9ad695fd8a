"""aligntools: capture, compare and gate train-inference numerical alignment.

Importing aligntools stays light: nnsight, minirl, vllm and sglang are imported only by the
adapters that need them, when a target of theirs is captured.
"""

from aligntools.capture import Capture, CaptureFileError
from aligntools.recorder import CaptureBudgetExceeded
from aligntools.tracker import Tracker, capture
from aligntools.accuracy_gate import assert_aligned
from aligntools.compare import compare
from aligntools.comparison import Comparison
from aligntools.tolerance import Tolerance
from aligntools.replay import ReplayResult, replay
from aligntools.attribution import Attribution, attribute
from aligntools.alignment_gate import GateResult, check_alignment
