"""The ``TrainConfig`` field reference in docs/rl.md, generated from the dataclass so it cannot drift.

    python -m minirl.training.config_reference        # rewrite the block between the markers in docs/rl.md

Each row: name, type (the annotation), default, valid range (``minirl.training.config_check.RANGES``)
and the field's docstring (the string literal
under it in ``minirl/training/train_config.py``, where the paper section it comes from is cited), grouped
by the ``# --- section`` comments of the class. ``tests/minirl/training/test_config_reference.py`` fails
when the block in the docs is not what this module renders.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

START, END = "<!-- fields:start -->", "<!-- fields:end -->"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rl.md"


def table() -> str:
    """The markdown table of every ``TrainConfig`` field, in class order."""
    from minirl.training import train_config
    from minirl.training.config_check import RANGES

    source = Path(train_config.__file__).read_text()
    docs, types, sections = _from_source(source)
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(train_config.TrainConfig)}
    lines = ["| field | type | default | valid | what it does (source) |", "|---|---|---|---|---|"]
    for name, default in defaults.items():
        if name in sections:
            lines.append(f"| **{sections[name]}** | | | | |")
        valid = RANGES[name].describe() if name in RANGES else ""
        lines.append(f"| `{name}` | {_cell(f'`{types[name]}`')} | `{default!r}` | {_cell(valid)} | "
                     f"{_cell(docs.get(name, ''))} |")
    return "\n".join(lines)


def render(text: str) -> str:
    """``text`` (a docs page) with the block between ``START`` and ``END`` replaced by ``table()``."""
    if START not in text or END not in text:
        raise ValueError(f"the page has no {START} ... {END} block to fill")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def _from_source(source: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(docstring, annotation text, section title where a new one starts) per field name."""
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    lines = source.splitlines()
    docs, types, sections = {}, {}, {}
    body = cls.body
    last_line = cls.lineno
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        types[name] = ast.unparse(node.annotation)
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[name] = after.value.value
        for line in lines[last_line:node.lineno - 1]:
            match = re.match(r"\s*# --- (.+)", line)
            if match:
                sections[name] = match.group(1).strip()
        last_line = (after.end_lineno if docs.get(name) else node.end_lineno) or node.lineno
    return docs, types, sections


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def main() -> int:
    DOCS.write_text(render(DOCS.read_text()))
    print(f"wrote the TrainConfig field table into {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
