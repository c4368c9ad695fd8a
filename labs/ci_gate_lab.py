"""Wiring the alignment gates into a project's CI: ``mlab check`` and the pytest plugin.

Two gates, two questions (docs/gate.md): ``mlab check`` asks "is the inference engine aligned
with the training engine?" (exit 0 aligned, 1 misaligned, 2 usage error: a CI step fails on
anything but 0); the pytest plugin's ``assert_aligned`` asks "is my changed kernel at least as
accurate as the one it replaces?" inside the project's own test suite, with one reviewed
tolerance file for the whole project (ini option ``aligntools_tolerance``).

``scaffold_project`` writes a minimal project that uses both, so the notebook runs real CI
commands in a subprocess, exactly as a CI runner would.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TOLERANCE = {  # format: aligntools/analyzer/tolerance.py; sites > default > dtypes
    "default": {"k": 2.0, "atol": 1e-6},
    "dtypes": {"bfloat16": {"floor": 0.02}},
    "sites": {"L*.router_logits": {"k": 4.0}},
}

CONFTEST = 'pytest_plugins = ["aligntools.gates.pytest_plugin"]\n'

PYTEST_INI = "[pytest]\naligntools_tolerance = tolerance.json\n"

TEST_FILE = '''"""Accuracy gate for an RMSNorm change: candidate vs the kernel it replaces, both vs float64."""
import pytest
import torch
import transformers

import aligntools
from aligntools.gates.inputs import prepare_tokens
from minirl import Engine, Knobs

MODEL = {model!r}
IDS = prepare_tokens(MODEL, {tokens})


@pytest.fixture(scope="module")
def captures():
    fp64 = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64).eval()
    def engine(rmsnorm):
        return aligntools.capture(Engine.from_pretrained(MODEL, dtype="float32",
                                                         knobs=Knobs.aligned().replace(rmsnorm=rmsnorm)), IDS)
    return {{"reference": aligntools.capture(fp64, IDS), "hf": engine("hf"),
            "fused_add": engine("fused_add"), "bf16_compute": engine("bf16_compute")}}


def test_fused_add_rmsnorm_is_as_accurate(captures, assert_aligned):
    assert_aligned(captures["fused_add"], captures["hf"], captures["reference"])


def test_bf16_compute_rmsnorm_regresses(captures, assert_aligned):
    """A deliberately worse kernel: this test is meant to fail, to show what CI prints."""
    assert_aligned(captures["bf16_compute"], captures["hf"], captures["reference"])
'''


@dataclass
class CommandRun:
    """One CI command: what was run, its exit code, its output and how long it took."""

    command: list[str]
    exit_code: int
    output: str
    seconds: float

    @property
    def shell(self) -> str:
        return " ".join(self.command)

    @property
    def summary(self) -> str:
        """pytest's closing counts line ("1 failed, 1 passed in 4.4s"): the last line that holds
        one, not the last line, which may be a warning printed at interpreter exit (a SWIG-built
        extension's ``sys:1: DeprecationWarning``); the last line when pytest printed none."""
        lines = self.output.strip().splitlines() or [""]
        counts = [line for line in lines if re.search(r"\d+ (passed|failed|error|skipped|deselected)", line)
                  and not line.startswith("E ")]
        return (counts or lines)[-1].strip("= ")


def _run(command: list[str], cwd: Path) -> CommandRun:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return CommandRun(command, proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0)


def mlab_check(*args: str, cwd: str | os.PathLike = REPO) -> CommandRun:
    """``mlab check ARGS`` in a subprocess (``python -m labs.cli``: the same entry point as ``mlab``)."""
    return _run([sys.executable, "-m", "labs.cli", "check", *args], Path(cwd))


def scaffold_project(dest: str | os.PathLike, model_path: str | os.PathLike, tokens: int = 64) -> Path:
    """A minimal project using the pytest plugin: conftest.py, pytest.ini, tolerance.json and one
    test module with a passing and a deliberately failing accuracy gate. Returns ``dest``."""
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text(PYTEST_INI)
    (root / "tolerance.json").write_text(json.dumps(TOLERANCE, indent=2) + "\n")
    (root / "test_kernel_accuracy.py").write_text(TEST_FILE.format(model=str(model_path), tokens=tokens))
    return root


def run_pytest(project: str | os.PathLike) -> CommandRun:
    """The project's test suite as CI runs it (``-p no:cacheprovider``: leave no cache behind)."""
    return _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", "-rN", "--color=no"], Path(project))


def report_images(report: str | os.PathLike) -> list[bytes]:
    """The PNG plots embedded in an ``mlab check --report`` file, in page order."""
    text = Path(report).read_text()
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)]


def inline_html(report: str | os.PathLike, height: int = 600) -> str:
    """The report in an ``<iframe srcdoc>``: shown inline in JupyterLab and in exported HTML,
    with its styles kept out of the notebook's page."""
    doc = html.escape(Path(report).read_text(), quote=True)
    return f'<div><iframe srcdoc="{doc}" style="width:100%;height:{height}px;border:1px solid #ccc"></iframe></div>'


def github_actions_steps(model: str = "path/to/checkpoint") -> str:
    """The two CI steps as a GitHub Actions snippet (any CI that fails on a non-zero exit works)."""
    return f"""\
- name: alignment gate (train vs inference engine)
  run: mlab check --model {model} --infer minirl:aligned --dtype float32 --report gate.html
- name: kernel accuracy gates (pytest plugin, tolerance.json)
  run: python -m pytest -q
- uses: actions/upload-artifact@v4
  if: always()
  with: {{name: alignment-report, path: gate.html}}
"""
