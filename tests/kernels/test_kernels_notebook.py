"""notebooks/06_kernels.ipynb executes headless, with a per-cell timeout (DESIGN.md section 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "06_kernels.ipynb"


@pytest.mark.notebook
def test_kernels_notebook_runs_and_plots():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the error histogram
    text = "".join(o.get("text", "") for o in outputs)
    assert "fp32 router vs float64:           0.0% of tokens" in text
