"""``make workshop``: it builds what the notebooks build, times each, and says when the room is ready."""

from __future__ import annotations

import json
import re
from pathlib import Path

from labs import workshop

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def test_every_zoo_model_a_notebook_builds_is_prepared():
    named = {m for nb in NOTEBOOKS.glob("[0-9]*.ipynb")
             for cell in json.loads(nb.read_text())["cells"] if cell["cell_type"] == "code"
             for m in re.findall(r'zoo\.build\("([\w-]+)"', "".join(cell["source"]))}
    assert named and named <= {ck.label for ck in workshop.CHECKPOINTS}, named


def test_each_checkpoint_is_timed_and_the_room_is_said_ready(monkeypatch, tmp_path):
    monkeypatch.setenv("MLAB_ZOO_DIR", str(tmp_path))
    built = []
    fake = (workshop.Checkpoint("a", ("02",), lambda: built.append("a")),
            workshop.Checkpoint("b", ("04", "05"), lambda: built.append("b")))
    seconds = workshop.prepare(fake, progress=False)
    assert built == ["a", "b"] and list(seconds) == ["a", "b"]
    text = workshop.ready_message({"a": 12.4, "b": 30.0}, fake)
    assert text.splitlines()[:2] == ["      12 s  a  (notebooks 02)", "      30 s  b  (notebooks 04, 05)"]
    assert text.endswith(f"The room is ready: 2 checkpoints in 42 s under {tmp_path}. Next: `make lab`.")
