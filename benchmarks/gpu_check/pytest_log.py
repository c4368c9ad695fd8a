"""A pytest plugin (``-p benchmarks.gpu_check.pytest_log``): one JSON line per test outcome,
appended to ``$GPU_CHECK_PYTEST_LOG`` the moment it is known, so that a run killed at its
budget still says which tests passed."""

from __future__ import annotations

import json
import os

import pytest

ENV = "GPU_CHECK_PYTEST_LOG"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":  # a pass of setup/teardown says nothing
        with open(os.environ[ENV], "a") as fh:
            fh.write(json.dumps({"test": report.nodeid, "when": report.when, "outcome": report.outcome}) + "\n")


def outcomes(lines: list[str]) -> dict[str, str]:
    """test id -> passed / failed / error (setup or teardown failed) / skipped."""
    result: dict[str, str] = {}
    for line in lines:
        entry = json.loads(line)
        if entry["outcome"] == "skipped":
            result[entry["test"]] = "skipped"
        elif entry["outcome"] == "failed":
            result[entry["test"]] = "failed" if entry["when"] == "call" else "error"
        else:
            result.setdefault(entry["test"], "passed")
    return result
