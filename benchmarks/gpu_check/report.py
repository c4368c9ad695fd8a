"""The run's report: ``report.json`` (everything) and ``report.md`` (a summary table, then each
stage's numbers and errors). The summary table is also what the command prints."""

from __future__ import annotations

import json
from pathlib import Path


def fmt(value: object) -> str:
    """Four significant digits for floats (numbers span ns to GB/s), the rest as written."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _last_line(text: str) -> str:
    """A traceback's last line is the exception; a one-line message is itself."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def summary_table(results: list[dict]) -> str:
    """One markdown row per stage: status, time against budget, how many numbers, first error."""
    lines = ["| stage | status | time (s) | budget (s) | numbers | first error |", "|---|---|---|---|---|---|"]
    for r in results:
        error = next(iter(r.get("errors", {}).items()), None)
        first = "" if error is None else _cell(f"{error[0]}: {_last_line(error[1])}")[:160]
        lines.append(f"| {r['stage']} | {r['status']} | {r.get('seconds', 0.0):.1f} | {fmt(r.get('budget_s', ''))} "
                     f"| {len(r.get('metrics', {}))} | {first} |")
    return "\n".join(lines)


def markdown(results: list[dict], meta: dict) -> str:
    head = ", ".join(f"{k} {fmt(v)}" for k, v in meta.items())
    parts = [f"# GPU check{' (dry run)' if meta.get('dry_run') else ''}", "", head, "", summary_table(results)]
    for r in results:
        parts += ["", f"## {r['stage']}: {r['status']}", "", r.get("proves", ""), ""]
        if r.get("metrics"):
            parts += ["| measure | value |", "|---|---|"]
            parts += [f"| {_cell(k)} | {_cell(fmt(v))} |" for k, v in r["metrics"].items()]
        for name in r.get("files", []):
            parts += ["", f"![{name}]({name})" if name.endswith(".png") else f"[{name}]({name})"]
        for label, error in r.get("errors", {}).items():
            parts += ["", f"**{label}**:", "```", error, "```"]
    return "\n".join(parts) + "\n"


def write_report(results: list[dict], meta: dict, out: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` under ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "report.json", out / "report.md"
    js.write_text(json.dumps({"meta": meta, "stages": results}, indent=1, default=str))
    md.write_text(markdown(results, meta))
    return js, md
