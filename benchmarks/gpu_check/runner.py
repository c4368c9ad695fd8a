"""Stages with time budgets, isolated from one another.

Why a worker process: a stage can hang in a kernel, segfault, or leave a sticky CUDA error that
poisons every later call in its process. The parent (this module, importing nothing heavy) starts
one worker that runs the pending stages in order, importing torch once. A stage that fails ends
its worker, so the next stage starts in a fresh process; a stage that outlives its budget has its
worker's process group killed. Either way the remaining stages still run.

Each stage writes ``stages/<name>.json`` as it goes (``Recorder``): its status, start time and
every number the moment it is measured, so a stage killed at its budget still reports what it had.

    python -m benchmarks.gpu_check.runner PLAN_JSON OUT_DIR REGISTRY STAGE...   # the worker (internal)
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
#: A worker that has not started its first stage after this long is stuck importing: killed.
STARTUP_S = 120.0
DONE = ("ok", "failed", "timeout", "crashed", "not run")


@dataclass(frozen=True)
class Stage:
    name: str
    target: str  # "module:function", called as function(plan, recorder)
    budget_s: float  # the most wall time the stage may take on the card
    proves: str  # one line for the report: what a green stage shows


class Recorder:
    """A stage's result file, rewritten atomically after every change."""

    def __init__(self, path: Path, stage: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"stage": stage, "status": "running", "started": time.time(),
                                     "metrics": {}, "errors": {}, "files": []}
        self._write()

    def file(self, name: str) -> Path:
        """Where the stage writes a file of its own (a plot, a table) into the report folder,
        named in the report; recorded before it is written, so a file cut short is still listed."""
        self.data["files"].append(name)
        self._write()
        return self.path.parents[1] / name

    def put(self, key: str, value: float | int | str | bool | None) -> None:
        """One measured value (a number, or a short string such as a variant name)."""
        self.data["metrics"][key] = value
        self._write()

    def attempt(self, label: str, fn: Callable[[], object]) -> None:
        """Run ``fn``; if it raises, record the error under ``label`` and carry on, so one model
        or one op that fails does not hide the numbers of the others. The stage then fails."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  (every failure is reported, none is swallowed)
            self.data["errors"][label] = f"{type(exc).__name__}: {exc}"
            self._write()

    def finish(self, error: str | None = None) -> None:
        if error is not None:
            self.data["errors"]["stage"] = error
        self.data["status"] = "failed" if self.data["errors"] else "ok"
        self.data["seconds"] = time.time() - self.data["started"]
        self.data["imports"] = imported_distributions()
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def imported_distributions() -> list[str]:
    """Installed distributions this process imported from: what the card must provide."""
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    tops = {name.split(".")[0] for name in list(sys.modules)}
    return sorted({dist for top in tops for dist in owners.get(top, [])})


def resolve(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def worker(plan_path: Path, out: Path, names: list[str], stages: dict[str, Stage]) -> int:
    """Run ``names`` in order; stop after the first failure (exit 3) so the rest get a fresh process."""
    from benchmarks.gpu_check.plan import Plan

    plan = Plan.from_json(plan_path)
    for name in names:
        rec = Recorder(result_path(out, name), name)
        print(f"== stage {name}", flush=True)
        try:
            resolve(stages[name].target)(plan, rec)
            rec.finish()
        except BaseException as exc:  # noqa: BLE001  (KeyboardInterrupt included: the parent is told)
            traceback.print_exc()
            output = getattr(exc, "stderr", None) or ""  # a failed subprocess: what it said
            rec.finish("\n".join([traceback.format_exc(limit=-4).strip(), *str(output).splitlines()[-15:]]))
        _release_device_memory()
        if rec.data["status"] != "ok":
            return 3
    return 0


def _release_device_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def result_path(out: Path, name: str) -> Path:
    return out / "stages" / f"{name}.json"


def read_result(out: Path, name: str) -> dict | None:
    try:
        return json.loads(result_path(out, name).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def stage_env(dry: bool, carried: Path | None, zoo: Path | None = None) -> dict[str, str]:
    """The stages' environment: carried wheels and the repo first on the path, the carried zoo
    (when there is one) as the zoo cache; Triton's interpreter on in the dry run and off on the
    card (where it would hide the compiler)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (carried, REPO, env.get("PYTHONPATH")) if p)
    if zoo is not None:
        env["MLAB_ZOO_DIR"] = str(zoo)
    if dry:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def run_stages(stages: list[Stage], plan_path: Path, out: Path, total_s: float, env: dict[str, str],
               registry: str = "benchmarks.gpu_check.stages:STAGES", poll_s: float = 0.2) -> list[dict]:
    """Run every stage within its budget and all of them within ``total_s``; one result each.

    A stage gets ``min(budget_s, time left of total_s)`` from the moment it starts. ``registry``
    names the list the worker looks the stages up in (tests pass their own)."""
    (out / "stages").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for stage in stages:  # a result left by an earlier run must not pass for this one's
        result_path(out, stage.name).unlink(missing_ok=True)
    deadline = time.monotonic() + total_s
    by_name = {s.name: s for s in stages}
    pending = [s.name for s in stages]
    results: dict[str, dict] = {}
    while pending:
        if time.monotonic() >= deadline:
            for name in pending:
                results[name] = _not_run(name, f"the run's {total_s:.0f} s were spent before it started")
            break
        log = out / "logs" / f"worker-{pending[0]}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check.runner", str(plan_path), str(out),
                                     registry, *pending], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            verdict = _watch(proc, pending, by_name, out, deadline, poll_s)
        for name in pending:
            result = read_result(out, name)
            if result is not None and result["status"] == "running":
                result.update(status=verdict, seconds=time.time() - result["started"])
                result["errors"]["stage"] = (f"killed at its {_allowed(by_name[name], result, deadline):.0f} s budget"
                                             if verdict == "timeout" else
                                             f"worker died (exit {proc.returncode}); log: {log}\n{_tail(log)}")
            if result is not None:
                results[name] = result
        started = [n for n in pending if n in results]
        if not started:  # the worker died before its first stage: nothing later would fare better
            for name in pending:
                results[name] = _not_run(name, f"worker exited {proc.returncode} before starting; log: {log}\n"
                                               f"{_tail(log)}")
        pending = [n for n in pending if n not in results]
    for stage in stages:
        results[stage.name].update(budget_s=stage.budget_s, proves=stage.proves)
    return [results[s.name] for s in stages]


def _watch(proc: subprocess.Popen, pending: list[str], stages: dict[str, Stage], out: Path,
           deadline: float, poll_s: float) -> str:
    """Wait for the worker; kill its process group when the running stage (or startup) overstays.
    Returns what a stage still marked running then is: ``timeout`` or ``crashed``."""
    born = time.monotonic()
    while proc.poll() is None:
        time.sleep(poll_s)
        running = [r for r in (read_result(out, n) for n in pending) if r and r["status"] == "running"]
        if running:
            over = time.time() - running[0]["started"] > _allowed(stages[running[0]["stage"]], running[0], deadline)
        else:
            over = time.monotonic() - born > min(STARTUP_S, max(deadline - time.monotonic(), 0) + 1)
        if over:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout"
    return "crashed"


def _allowed(stage: Stage, result: dict, deadline: float) -> float:
    """The stage's budget, cut to what was left of the run when it started."""
    left_at_start = deadline - time.monotonic() + (time.time() - result["started"])
    return max(0.0, min(stage.budget_s, left_at_start))


def _not_run(name: str, why: str) -> dict:
    return {"stage": name, "status": "not run", "metrics": {}, "errors": {"stage": why}, "seconds": 0.0}


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


if __name__ == "__main__":
    plan_file, out_dir, registry_name, *stage_names = sys.argv[1:]
    registry_list = resolve(registry_name)
    sys.exit(worker(Path(plan_file), Path(out_dir), stage_names, {s.name: s for s in registry_list}))
