"""Every notebook in notebooks/ runs headless at small size, and the runner enforces timeouts."""

from __future__ import annotations

import json
import re

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

from tests.labs.test_notebook_outputs import OUTPUT_CHECKS
from tests.notebook_runner import NOTEBOOKS, run_notebook

README = NOTEBOOKS.parent / "README.md"
RUNTIME_S = {f"{stem}.ipynb": int(s) for stem, s in
             re.findall(r"^\| `(\d\d_\w+)` \|.*\| (\d+) s \|$", README.read_text(), re.M)}
"""README's notebook table: each notebook's default-size runtime in seconds, measured."""
ALL = sorted((p.name for p in NOTEBOOKS.glob("*.ipynb")), key=lambda name: -RUNTIME_S.get(name, 0))
"""Longest first, so that the longest notebook runs start first under pytest-xdist."""


@pytest.mark.notebook
@pytest.mark.parametrize("name", ALL)
def test_notebook_executes(name, zoo_root):
    nb = run_notebook(NOTEBOOKS / name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "notebook has no code cells"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, f"{name} shows no plot"
    assert not loader_bars(nb), f"{name}: progress bars from a call made with progress=False: {loader_bars(nb)}"
    OUTPUT_CHECKS.get(name, lambda _: None)(nb)  # per-notebook checks on the real outputs


LOADER_BARS = ("Loading weights", "Loading safetensors checkpoint shards", "Multi-thread loading shards")
"""Third-party bars that ``minirl.quiet.quiet(progress=False)`` silences (transformers, vLLM): saved
as widgets they read "Error displaying widget: model not found" after reopening."""


def loader_bars(nb) -> list[str]:
    """The loader bars a notebook's outputs show, as widgets (text/plain) or on stderr."""
    texts = [o.get("data", {}).get("text/plain", "") or o.get("text", "")
             for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return sorted({bar for t in texts for bar in LOADER_BARS if bar in "".join(t)})


def test_loader_bars_are_found_in_widget_and_stderr_outputs():
    out = nbformat.v4.new_output("display_data", data={"text/plain": "Loading weights:  40%|####  | 19/47"})
    err = nbformat.v4.new_output("stream", name="stderr", text="Loading safetensors checkpoint shards: 100%|")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[out, err])])
    assert loader_bars(nb) == ["Loading safetensors checkpoint shards", "Loading weights"]
    assert loader_bars(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])) == []


@pytest.mark.notebook
def test_hung_cell_fails_instead_of_hanging(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(60)")])
    path = tmp_path / "hang.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(CellTimeoutError):
        run_notebook(path, cell_timeout=3)


@pytest.mark.parametrize("name", ALL)
def test_notebook_cells_have_unique_ids(name):
    """nbformat 4.5 requires a unique id per cell; it still adds missing ones with a warning,
    and says this "will become a hard error in future nbformat versions". A cell pasted in by
    hand lacked one (notebook 05)."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]  # as stored: nbformat.read adds ids
    ids = [c.get("id") for c in cells]
    assert None not in ids and len(set(ids)) == len(ids), f"{name}: cells without an id or with repeated ids"


@pytest.mark.parametrize("name", ALL)
def test_first_cell_says_how_long_it_takes_and_how_to_change_it(name):
    """The first cell quotes README's measured default-size time (one number, two places, checked)
    and says how to change the size (issue 29: a workshop budget, visible)."""
    first = "".join(json.loads((NOTEBOOKS / name).read_text())["cells"][0]["source"])
    assert name in RUNTIME_S, f"README's notebook table has no default-size time for {name}"
    assert f"**Runtime.** About {RUNTIME_S[name]} s at the default size" in first, first[-400:]
    assert "`MLAB_NOTEBOOK_SMALL=1`" in first or "no size switch" in first


def test_log_scale_ticks_find_matplotlib_own_fonts(tmp_path):
    """A log-scale tick is mathtext, whose DejaVu set loads the STIX fonts matplotlib ships. A per-user
    font cache written by another install (CI boxes carry one without them) makes each such tick warn
    into the notebooks; the Makefile points MPLCONFIGDIR at the venv's own cache. Rendered in a child
    so this process's loaded font list does not answer for the environment's."""
    import os
    import subprocess
    import sys
    code = ("import logging, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
            "logging.basicConfig()\n"
            "fig, ax = plt.subplots(); ax.set_yscale('log'); ax.plot([1, 2], [1e-3, 1e2]); fig.canvas.draw()")
    done = subprocess.run([sys.executable, "-c", code], env=os.environ, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "findfont" not in done.stderr, f"{done.stderr.strip()[:300]} (MPLCONFIGDIR={os.environ.get('MPLCONFIGDIR')})"
