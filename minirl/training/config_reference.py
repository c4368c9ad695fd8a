"""The ``TrainConfig`` field reference in docs/rl.md, generated from the dataclass so it cannot drift.

    python -m minirl.training.config_reference        # rewrite the block between the markers in docs/rl.md

Each row: name, type (the annotation), default, what is valid (the range or values the field declares,
``minirl.training.config_check``; for a registry switch its registered names, and for a knob the entries
that read it, ``minirl.algorithms.registry``) and the field's docstring (the string literal
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

from minirl.algorithms.registry import Registry

START, END = "<!-- fields:start -->", "<!-- fields:end -->"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rl.md"


def table() -> str:
    """The markdown table of every ``TrainConfig`` field, in class order."""
    from minirl.training import train_config

    source = Path(train_config.__file__).read_text()
    docs, types, sections = _from_source(source)
    fields = dataclasses.fields(train_config.TrainConfig)
    registries = {f.name: f.metadata["one_of"] for f in fields if isinstance(f.metadata.get("one_of"), Registry)}
    lines = ["| field | type | default | valid | what it does (source) |", "|---|---|---|---|---|"]
    for f in fields:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name in sections:
            lines.append(f"| **{sections[f.name]}** | | | | |")
        lines.append(f"| `{f.name}` | {_cell(f'`{types[f.name]}`')} | `{default!r}` | {_cell(_valid(f, registries))} | "
                     f"{_cell(docs.get(f.name, ''))} |")
    return "\n".join(lines)


def _valid(f: dataclasses.Field, registries: dict[str, Registry]) -> str:
    """What the field declares valid, and which registered entries read it."""
    words = []
    if "range" in f.metadata:
        words.append(f.metadata["range"].describe())
    if "one_of" in f.metadata:
        words.append("one of " + ", ".join(f"`{v}`" for v in f.metadata["one_of"]))
    if "non_empty" in f.metadata:
        words.append("not empty")
    readers = [f"`{switch}: {name}`" for switch, reg in registries.items() for name in reg.readers(f.name)]
    if readers:
        words.append("read by " + ", ".join(readers))
    return "; ".join(w for w in words if w)


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
