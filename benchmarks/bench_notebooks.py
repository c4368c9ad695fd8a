"""Each notebook's default-size run time, headless, warm and cold, with the CPU class: README's notebook table.

    .venv/bin/python benchmarks/bench_notebooks.py [02 04 ...] [--cold] [--out runs/notebook_times]

Why a script: the README's times are what a workshop host plans a room by, and hand-timed numbers
drifted (a wrong date, a total that did not add up, no CPU named). Each notebook runs in a fresh
kernel through nbclient, as the tests run them but at the default size (``MLAB_NOTEBOOK_SMALL=0``),
one at a time.

- **warm**: the zoo as ``make workshop`` leaves it (every checkpoint built), the state the README's
  "warm" column assumes.
- **cold** (``--cold``): an empty ``MLAB_ZOO_DIR`` (a temporary folder), so the run includes building
  what the notebook needs, as on a fresh laptop without ``make workshop``.

Also recorded per run: the kernel's CPU seconds and the 1-minute load average at its end (a shared box's
other work stretches the wall time, barely the CPU time: on a quiet box the two come close), stderr outputs and stray stdout lines (a quiet notebook
has neither outside its first cell). Prints a Markdown table and writes it, with the executed notebooks,
under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from labs.machine import cpu_class, cpu_model  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"


def run(path: Path, env: dict[str, str]) -> tuple[float, float, nbformat.NotebookNode]:
    """Wall seconds to run every cell of ``path`` in a fresh kernel (kernel start included), the kernel's
    CPU seconds (its user + system time, read once it has exited: a shared box stretches the wall time
    far more than this), and the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    cpu = _children_cpu()
    t = time.perf_counter()
    client.execute(env={**os.environ, "MLAB_NOTEBOOK_SMALL": "0", **env})
    return time.perf_counter() - t, _children_cpu() - cpu, nb


def _children_cpu() -> float:
    """User + system seconds of this process's exited, reaped children (the kernels)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def noise(nb: nbformat.NotebookNode) -> tuple[int, int]:
    """stderr outputs anywhere, and stdout lines after the first code cell (whose size line is expected)."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    streams = [(i, o) for i, c in enumerate(code) for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    stderr = sum(1 for _, o in streams if o["name"] == "stderr")
    stdout = sum(len(o["text"].splitlines()) for i, o in streams if o["name"] == "stdout" and i > 0)
    return stderr, stdout


def minutes(seconds: float) -> str:
    """"55 s" under a minute, else "2 min 03 s": the README's notation."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def measure(stems: list[str], cold: bool, out: Path) -> list[dict]:
    rows = []
    for stem in stems:
        path = next(NOTEBOOKS.glob(f"{stem}*.ipynb"))
        with tempfile.TemporaryDirectory(prefix="zoo_cold_") as empty:
            env = {"MLAB_ZOO_DIR": empty} if cold else {}
            seconds, cpu, nb = run(path, env)
        nbformat.write(nb, out / f"{path.stem}.{'cold' if cold else 'warm'}.ipynb")
        stderr, stdout = noise(nb)
        rows.append({"notebook": path.stem, "state": "cold" if cold else "warm", "seconds": seconds, "cpu": cpu,
                     "load": os.getloadavg()[0], "stderr": stderr, "stdout": stdout})
        print(f"{path.stem} {rows[-1]['state']}: {minutes(seconds)} ({seconds:.0f} s, kernel CPU {cpu:.0f} s), "
              f"load {rows[-1]['load']:.1f}; stderr outputs {stderr}, stray stdout lines {stdout}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    machine = f"{cpu_class()}: {cpu_model()}, {os.cpu_count()} cores"
    lines = [f"Notebook run times, default size, headless (nbclient), one at a time; CPU class {machine}.", "",
             "| notebook | zoo | time | kernel CPU | load (1 min) | stderr outputs | stray stdout lines |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| `{r['notebook']}` | {r['state']} | {minutes(r['seconds'])} | {minutes(r['cpu'])} | {r['load']:.1f} | "
              f"{r['stderr']} | {r['stdout']} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", default=sorted(p.name[:2] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")),
                    help="notebook numbers (default: every numbered notebook)")
    ap.add_argument("--cold", action="store_true", help="empty zoo: include building the checkpoints")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "notebook_times")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(measure(args.notebooks, args.cold, args.out))
    (args.out / f"times.{'cold' if args.cold else 'warm'}.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
