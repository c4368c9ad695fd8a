"""bench_notebooks.py's readings of a run: the README's time notation and what counts as noise."""

from __future__ import annotations

import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_notebook, new_output

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_notebooks as bench  # noqa: E402


def test_times_read_as_the_readme_writes_them():
    assert bench.minutes(55.4) == "55 s" and bench.minutes(123) == "2 min 03 s"


def test_noise_is_any_stderr_and_stdout_after_the_first_cell():
    first = new_code_cell("x", outputs=[new_output("stream", name="stdout", text="tiny-qwen3-moe-seed0 full size\n")])
    later = new_code_cell("y", outputs=[new_output("stream", name="stdout", text="mismatch monitor: a\nb\n"),
                                        new_output("stream", name="stderr", text="WARNING numa\n")])
    assert bench.noise(new_notebook(cells=[first, later])) == (1, 2)
    assert bench.noise(new_notebook(cells=[first])) == (0, 0)
