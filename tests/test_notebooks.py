"""Every notebook in notebooks/ runs headless at small size, and the runner enforces timeouts."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

from tests.labs.test_notebook_outputs import OUTPUT_CHECKS
from tests.notebook_runner import NOTEBOOKS, run_notebook

ALL = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


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
    OUTPUT_CHECKS.get(name, lambda _: None)(nb)  # per-notebook checks on the real outputs


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
