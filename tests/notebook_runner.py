"""Execute notebooks headless with a per-cell timeout (a hung widget cell fails, never hangs CI)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run_notebook(path: Path, cell_timeout: int = 600, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel; raises on the first failing or hung cell.

    ``MLAB_NOTEBOOK_SMALL=1`` tells notebooks to use their small-size parameters. The 600 s per
    cell is a hang guard, not a speed check: on a fresh clone a cell may build an SFT warm-up
    while the other test worker shares the two cores (05's training cell passed 300 s so, once).
    """
    nb = nbformat.read(path, as_version=4)
    kernel_env = {**os.environ, "MLAB_NOTEBOOK_SMALL": "1",
                  "MPLBACKEND": "module://matplotlib_inline.backend_inline", **(env or {})}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=kernel_env)
    return nb
