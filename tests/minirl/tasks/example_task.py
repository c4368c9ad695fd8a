"""The worked example task of docs/rl.md ("Adding a task"), written out as the module a researcher would save."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "rl.md"


def write_example(folder: Path) -> Path:
    """Write docs/rl.md's example task to ``folder/my_tasks.py`` (put ``folder`` on the path to import it)."""
    text = DOC.read_text()
    block = text.split("<!-- example-task:start -->", 1)[1].split("<!-- example-task:end -->", 1)[0]
    code = block.split("```python\n", 1)[1].rsplit("```", 1)[0]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_tasks.py").write_text(code)
    return folder / "my_tasks.py"
