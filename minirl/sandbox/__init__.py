"""Running model-written Python: an OS boundary (bubblewrap) around a limited interpreter.
``run_python`` is the public door."""

from minirl.sandbox.runner import MAX_RESPONSE_CHARS, OUTCOMES, ToolResult, run_python

__all__ = ["MAX_RESPONSE_CHARS", "OUTCOMES", "ToolResult", "run_python"]
