"""Execute notebooks headless with a per-cell timeout (a hung widget cell fails, never hangs CI)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run_notebook(path: Path, cell_timeout: int = 300, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel; raises on the first failing or hung cell.

    ``MLAB_NOTEBOOK_SMALL=1`` tells notebooks to use their small-size parameters.
    """
    nb = nbformat.read(path, as_version=4)
    kernel_env = {**os.environ, "MLAB_NOTEBOOK_SMALL": "1",
                  "MPLBACKEND": "module://matplotlib_inline.backend_inline", **(env or {})}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=kernel_env)
    return nb
