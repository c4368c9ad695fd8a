"""docs/models.md's support tables, generated from the family matrix's rows.

Why generated: the table is a claim per family ("passes both gates and trains"), and a claim
typed by hand went stale (gemma2 and gpt_oss failed `mlab train` while the table said yes). The
matrix (tests/families/test_cli_matrix.py) writes one JSON row per family it ran into the
folder named by ``MLAB_FAMILY_ROWS``; this module renders those rows between the markers in
docs/models.md, with each row's date and CPU.

    MLAB_FAMILY_ROWS=/tmp/rows pytest tests/families/test_cli_matrix.py -m slow
    python -m tests.families.table /tmp/rows docs/models.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BEGIN, END = "<!-- family-table:begin -->", "<!-- family-table:end -->"
COLUMNS = ("family (`model_type`)", "entry", "trainer max \\|Δ\\| (nats)", "HF invariants", "minirl",
           "gate fp32 (exit, sites, worst)", "gate bf16", "RL on vLLM: k3 step 0 → 1", "measured")


def render_row(row: dict) -> str:
    """One markdown table row from a matrix row (keys as ``test_cli_matrix.run_family`` writes)."""
    fp32 = row.get("gate_fp32") or {}
    gate = (f"{fp32['exit']}, {fp32['compared']}/{fp32['total']}, {fp32['worst']} {fp32['worst_rel_l2']:.1e}"
            if fp32.get("exit") in (0, 1) else f"{fp32.get('exit', '–')}: {_short(fp32.get('refusal', ''))}")
    rl = row.get("rl")
    rl_cell = f"{rl['k3'][0]:.1e} → {rl['k3'][1]:.1e}" if rl and rl.get("exit") == 0 else \
        (f"exit {rl['exit']}: {_short(rl.get('refusal', ''))}" if rl else "–")
    cells = [row["family"], "yes" if row["entry"] else "no", _number(row.get("trainer")),
             row["invariants"], _short(row["minirl"], 60), gate, str(row.get("gate_bf16", "–")), rl_cell,
             f"{row['date']}, {row['cpu']}"]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    return "\n".join([head, *(render_row(r) for r in sorted(rows, key=lambda r: (not r["in_table"], r["family"])))])


def write(rows_dir: Path, doc: Path) -> None:
    """Replace the text between the markers of ``doc`` with the table of ``rows_dir``'s rows."""
    rows = [json.loads(p.read_text()) for p in sorted(rows_dir.glob("*.json"))]
    if not rows:
        raise SystemExit(f"{rows_dir}: no matrix rows (*.json); run the matrix with MLAB_FAMILY_ROWS={rows_dir}")
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: the markers {BEGIN} / {END} are missing")
    head, rest = text.split(BEGIN, 1)
    doc.write_text(f"{head}{BEGIN}\n{render(rows)}\n{END}{rest.split(END, 1)[1]}")


def _number(value: float | str | None) -> str:
    return "–" if value is None else value if isinstance(value, str) else f"{value:.1e}"


def _short(text: str, n: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


if __name__ == "__main__":
    write(Path(sys.argv[1]), Path(sys.argv[2]))
