"""docs/models.md's tables are rendered from the matrix's rows (tests/families/table.py), and the
rendered table in the repo covers every family the matrix runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.families import table, tiny

REPO = Path(__file__).resolve().parents[2]
ROWS = {
    "ok": {"family": "llama", "in_table": True, "entry": True, "trainer": 5.2e-07, "invariants": "hold",
           "minirl": "yes", "gate_fp32": {"exit": 0, "compared": 41, "total": 41, "worst": "logits",
                                          "worst_rel_l2": 3.4e-07, "reasons": []},
           "gate_bf16": 1, "rl": {"exit": 0, "refusal": "", "k3": [7.5e-06, 9.1e-06]}, "date": "2026-12-07",
           "cpu": "AVX2 (Zen 3)"},
    "refused": {"family": "gpt2", "in_table": False, "entry": False, "trainer": 5.1e-07,
                "invariants": "refused: the captured `embed` site: not proved", "minirl": "refused: x",
                "gate_fp32": {"exit": 2, "refusal": "gpt2 on transformers: the captured | `embed` site"},
                "date": "2026-12-07", "cpu": "AVX2 (Zen 3)"},
}


def test_a_row_shows_its_numbers_and_a_refusal_its_reason():
    ok, refused = table.render_row(ROWS["ok"]), table.render_row(ROWS["refused"])
    misaligned = table.render_row({**ROWS["ok"], "gate_fp32": {**ROWS["ok"]["gate_fp32"], "exit": 1}, "rl": None})
    assert "| 1, 41/41, logits 3.4e-07 |" in misaligned and misaligned.count("| – |") == 1
    assert "| llama | yes | 5.2e-07 | hold | yes | 0, 41/41, logits 3.4e-07 | 1 | 7.5e-06 → 9.1e-06 |" in ok
    assert ok.endswith("| 2026-12-07, AVX2 (Zen 3) |")
    assert "| 2: gpt2 on transformers: the captured \\| `embed` site | – | – |" in refused


def test_write_replaces_only_the_text_between_the_markers(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    for name, row in ROWS.items():
        (rows / f"{name}.json").write_text(json.dumps(row))
    doc = tmp_path / "models.md"
    doc.write_text(f"before\n{table.BEGIN}\nstale\n{table.END}\nafter\n")
    table.write(rows, doc)
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith(f"{table.END}\nafter\n") and "stale" not in text
    assert text.index("| llama |") < text.index("| gpt2 |")  # the table's families first
    with pytest.raises(SystemExit, match="no matrix rows"):
        table.write(tmp_path, doc)


def test_the_docs_table_covers_every_family_the_matrix_runs():
    text = (REPO / "docs/models.md").read_text()
    generated = text.split(table.BEGIN, 1)[1].split(table.END, 1)[0]
    listed = {line.split("|")[1].strip() for line in generated.strip().splitlines()[2:]}
    assert listed == set(tiny.FAMILIES) - {"deepseek_v3"} | set(tiny.OUTSIDE)
