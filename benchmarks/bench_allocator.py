"""Wall time per RL step on glibc's allocator vs tcmalloc (labs/allocator.py), same config, same run.

    .venv/bin/python benchmarks/bench_allocator.py [--config configs/collapse.yaml] [--steps 8] [--repeats 2]

Why: the allocator is picked before a process starts, so it cannot be swapped inside one; each
block is a fresh child process (``MLAB_MALLOC=system`` or the preload), blocks interleaved
(system, tcmalloc, tcmalloc, system, ...) so drift on a shared box hits both alike. A child builds
the smollm2-135m zoo model's ``Trainer`` from the config (no evaluation, no checkpoints), runs
``--steps`` steps and reports each step's split; the first two steps of a block (warm-up: the first
update allocates AdamW's state) are not counted. Prints medians and system / tcmalloc.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labs import allocator, zoo  # noqa: E402

PARTS = ("time_rollout", "time_old_logprobs", "time_update", "time_sync")
WARMUP = 2


def child(config: str, steps: int, model: str) -> None:
    """One block: print one JSON line per step (wall time and its split) and whether tcmalloc is mapped."""
    from minirl.training.config_file import read_config_file
    from minirl.training.train_config import TrainConfig
    from minirl.training.trainer import Trainer

    values = read_config_file(config)
    with tempfile.TemporaryDirectory() as out:
        values.update(model=model, steps=steps, eval_every=0, monitor_every=0, checkpoint_every=0, out_dir=out,
                      progress=False)
        trainer = Trainer(TrainConfig.from_dict(values))
        for step in range(steps):
            t = time.perf_counter()
            m = trainer.train_step(step)
            print(json.dumps({"step": time.perf_counter() - t, **{k: m.get(k, 0.0) for k in PARTS},
                              "tcmalloc": allocator.active()}), flush=True)


def block(which: str, args: argparse.Namespace, model: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.RELAUNCHED)}
    env = {**env, "MLAB_MALLOC": "system"} if which == "system" else {**env, **allocator.preload_env(env)}
    cmd = [sys.executable, __file__, "--child", "--config", args.config, "--steps", str(args.steps), "--model", model]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if any(r["tcmalloc"] != (which == "tcmalloc") for r in rows):
        raise RuntimeError(f"the {which} block did not run on the allocator it was meant to")
    return rows[WARMUP:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/collapse.yaml")
    ap.add_argument("--steps", type=int, default=8, help=f"steps per block (the first {WARMUP} not counted)")
    ap.add_argument("--repeats", type=int, default=2, help="pairs of blocks, interleaved")
    ap.add_argument("--model", default=None, help="checkpoint (default: the smollm2-135m zoo build)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = args.model or str(zoo.build("smollm2-135m"))
    if args.child:
        child(args.config, args.steps, model)
        return
    if allocator.library() is None:
        raise SystemExit(f"{allocator.LIBRARY} not found: install libtcmalloc-minimal4 (make debs) and rerun")
    order = [w for i in range(args.repeats) for w in (("system", "tcmalloc") if i % 2 == 0 else ("tcmalloc", "system"))]
    rows: dict[str, list[dict]] = {"system": [], "tcmalloc": []}
    for which in order:
        rows[which] += block(which, args, model)
        print(f"{which}: {len(rows[which])} steps so far", file=sys.stderr, flush=True)
    med = {w: {k: statistics.median(r[k] for r in rs) for k in ("step", *PARTS)} for w, rs in rows.items()}
    print(f"{args.config}, {args.repeats} x {args.steps - WARMUP} timed steps per allocator, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| allocator | s/step | rollout | old logprobs | update | sync |\n|---|---|---|---|---|---|")
    for w, m in med.items():
        print(f"| {w} | {m['step']:.2f} | " + " | ".join(f"{m[k]:.2f}" for k in PARTS) + " |")
    print(f"system / tcmalloc: {med['system']['step'] / med['tcmalloc']['step']:.2f}x per step, "
          f"{med['system']['time_update'] / med['tcmalloc']['time_update']:.2f}x per update")


if __name__ == "__main__":
    main()
