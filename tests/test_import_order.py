"""Every aligntools module imports when it is the first of the package a process imports.

Why: the package's public names load on first use (``aligntools._lazy``), so which aligntools module a
process meets first is the caller's choice: a Ray actor starts at ``aligntools.monitor``, the TRL recipe at
``aligntools.integrations``, ``mlab`` at ``aligntools.cli``. An import cycle that one order hides breaks
another (``adapters.base`` importing ``tracker.recorder`` once broke three of those callers). Each module
is imported in a forked child of a process that has loaded the third-party libraries only, so the test
pays aligntools' own imports, not torch's, per module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILDREN = r"""
import importlib, os, sys, traceback
# third-party libraries only, loaded once and shared by the children
import h5netcdf, IPython, ipywidgets, matplotlib.figure, numba, numpy, pandas, safetensors, torch, transformers, xarray
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print("FAILED", failed)
"""


def modules(package: str) -> list[str]:
    """Every module of ``package`` by its file, without importing any."""
    root = REPO / package
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_aligntools_module_imports_first():
    names = modules("aligntools")
    assert len(names) > 50 and "aligntools.monitor" in names
    proc = subprocess.run([sys.executable, "-c", CHILDREN, *names], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FAILED []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-6000:]
