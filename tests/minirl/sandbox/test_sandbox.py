"""Hostile-code tests of the public sandbox surface ``minirl.sandbox.run_python``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from minirl.sandbox.runner import MAX_RESPONSE_CHARS, OUTCOMES, ToolResult, run_python


@pytest.mark.parametrize("code, outcome, text", [
    ("print(6 * 7)", "stdout", "42"),
    ("x = 6\nx * 7", "no_stdout", "42"),  # IPython-style display of the last expression
    ("x = 1", "no_stdout", "(no output)"),
    ("1 / 0", "error", "ZeroDivisionError"),
    ("def (", "error", "SyntaxError"),
    ("import sys; sys.exit(3)", "error", "SystemExit: 3"),
])
def test_four_outcomes(code: str, outcome: str, text: str) -> None:
    r = run_python(code)
    assert isinstance(r, ToolResult) and r.outcome in OUTCOMES
    assert (r.outcome, text in r.text) == (outcome, True), r


def test_infinite_loop_times_out() -> None:
    t0 = time.monotonic()
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.outcome == "timeout" and r.is_error
    assert time.monotonic() - t0 < 4


def test_network_is_unreachable() -> None:
    code = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "s.settimeout(1)\ns.connect(('1.1.1.1', 80))\nprint('connected')")
    r = run_python(code)
    assert r.outcome == "error" and "connected" not in r.text
    r = run_python("import socket\nsocket.getaddrinfo('example.com', 80)")
    assert r.outcome == "error"


def test_writes_outside_temp_dir_fail(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"import os\nos.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))",
                 f"import os\nos.mkdir({str(tmp_path / 'd')!r})",
                 f"import os\nos.symlink('/etc', 'link')\nopen('link/evil', 'w')"):
        r = run_python(code)
        assert r.outcome == "error" and "PermissionError" in r.text, (code, r)
    assert list(tmp_path.iterdir()) == []
    inside = run_python("open('ok.txt', 'w').write('fine')\nprint(open('ok.txt').read())")
    assert (inside.outcome, inside.text.strip()) == ("stdout", "fine")


def test_huge_allocation_is_stopped() -> None:
    r = run_python("x = bytearray(4 * 1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert r.outcome == "error" and "MemoryError" in r.text
    r = run_python("x = [0] * (10 ** 10)", memory_mb=256)
    assert r.outcome == "error"


def test_output_flood_is_truncated() -> None:
    r = run_python("print('a' * 10 ** 7)")
    assert r.outcome == "stdout" and len(r.text) <= MAX_RESPONSE_CHARS + 100 and "truncated" in r.text
    r = run_python("while True:\n    print('b' * 1000)", timeout_s=1.0)
    assert r.outcome == "timeout" and len(r.text) <= MAX_RESPONSE_CHARS + 100


def test_crash_is_an_error_outcome() -> None:
    r = run_python("import os, signal\nos.abort()")
    assert r.outcome == "error" and "signal" in r.text.lower()
