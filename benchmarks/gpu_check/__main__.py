"""Command line: run the stages, write ``report.json`` + ``report.md`` under ``--out``, print the
summary table. Exit status 0 only when every stage is ``ok``."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from benchmarks.gpu_check import wheels
from benchmarks.gpu_check.plan import dry_plan, gpu_plan
from benchmarks.gpu_check.report import summary_table, write_report
from benchmarks.gpu_check.runner import REPO, run_stages, stage_env
from benchmarks.gpu_check.stages import STAGES, TOTAL_S


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "gpu-check", help="report folder")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton through its interpreter")
    ap.add_argument("--wheels", type=Path, default=REPO / ".gpu-wheels",
                    help="carried wheels to install first (make gpu-wheels fills it)")
    ap.add_argument("--only", nargs="+", choices=[s.name for s in STAGES], help="run these stages only")
    ap.add_argument("--total-s", type=float, default=TOTAL_S,
                    help="cap on the stages' wall time on the card (the dry run scales it)")
    args = ap.parse_args(argv)
    if args.total_s <= 0:
        ap.error(f"--total-s {args.total_s}: give a positive number of seconds (default {TOTAL_S:.0f})")
    t0 = time.monotonic()
    carried = None if args.dry_run else wheels.install(args.wheels)
    if carried is not None:
        sys.path.insert(0, str(carried))  # so the versions below are the ones the stages import
    plan = dry_plan() if args.dry_run else gpu_plan()
    args.out.mkdir(parents=True, exist_ok=True)
    plan.to_json(args.out / "plan.json")
    stages = [dataclasses.replace(s, budget_s=s.budget_s * plan.budget_scale)
              for s in STAGES if args.only is None or s.name in args.only]
    zoo = wheels.zoo_dir(args.wheels.resolve())
    zoo = zoo if not args.dry_run and zoo.is_dir() else None
    results = run_stages(stages, args.out / "plan.json", args.out, args.total_s * plan.budget_scale,
                         stage_env(args.dry_run, carried, zoo))
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "dry_run": args.dry_run, "wall_s": round(time.monotonic() - t0, 1), "python": platform.python_version(),
            "carried": sorted(p.name for p in args.wheels.glob("*.whl")) if carried else [],
            "carried_zoo": str(zoo or ""), **{d: _version(d) for d in ("torch", "triton", "transformers")}}
    js, md = write_report(results, meta, args.out)
    print(summary_table(results))
    print(f"\n{meta['wall_s']} s in all; report: {md} and {js}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
