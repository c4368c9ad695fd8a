"""Stage: every ``gpu``-marked test, through pytest, counted as the results come (``pytest_log``).

Only the files that hold such tests are collected: collecting the whole suite on the card would
import test modules whose packages (selenium, ray, nbclient, ...) it does not have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.gpu_check import pytest_log
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.runner import REPO, Recorder

MARK = "pytest.mark.gpu"


def gpu_test_files(root: Path = REPO) -> list[Path]:
    """Test files under tests/ and benchmarks/ that mark something ``gpu``."""
    files = [*root.glob("tests/**/test_*.py"), *root.glob("benchmarks/**/test_*.py")]
    return sorted(f for f in files if MARK in f.read_text(errors="replace"))


def gpu_tests(plan: Plan, rec: Recorder) -> None:
    """One pytest run; the counts are recorded while it runs, so a run cut off by the budget
    still reports the tests that finished."""
    files = [str(f.relative_to(REPO)) for f in gpu_test_files()]
    rec.put("files", len(files))
    log = rec.path.parent.parent / "pytest-gpu.jsonl"
    log.unlink(missing_ok=True)
    log.touch()
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", pytest_log.__name__,
           *files]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, pytest_log.ENV: str(log)})
    while proc.poll() is None:
        time.sleep(1)
        _record(log, rec)
    results = _record(log, rec)
    bad = sorted(test for test, outcome in results.items() if outcome in ("failed", "error"))
    if proc.returncode not in (0, 1, 5) or not results:  # 1: tests failed, 5: none selected
        raise RuntimeError(f"pytest exited {proc.returncode} after {len(results)} test(s); see the log")
    if bad:
        raise AssertionError(f"{len(bad)} gpu test(s) failed: {', '.join(bad)}")
    if plan.dry and set(results.values()) != {"skipped"}:
        raise AssertionError(f"on CPU every gpu test should skip; {Counter(results.values())}")


def _record(log: Path, rec: Recorder) -> dict[str, str]:
    results = pytest_log.outcomes(log.read_text().splitlines())
    counts = Counter(results.values())
    rec.put("tests", len(results))
    for outcome in ("passed", "failed", "error", "skipped"):
        rec.put(outcome, counts[outcome])
    return results
