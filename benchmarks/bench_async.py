"""async (1-step-off, AsyncFlow §4.2.2) vs sync on a long-tail length task, plus a cost model.

    .venv/bin/python benchmarks/bench_async.py --steps 8 [--ray]

Prints samples/s and wall time per step of both modes and their ratio (goal >= 1.3x on 2
cores), the final reward of both, the measured phase times, and the cost model's predicted
async/sync speedup at 1/2/8/64/512 rollout workers; saves the timelines and the model's plot
under runs/bench_async/ (PNGs, not committed). ``--ray`` adds the same run on Ray actors with 1
and 2 rollout actors, lockstep (``max_staleness=0``) and 1-step-off: separate processes, so the
overlap is not limited by one interpreter's GIL; those are the measured points the cost model is
checked against, plus 2 actors with length-aware dispatch (``dispatch="longest_first"``, CompassMax
§3.1.1). Step times leave out step 0 (start-up). Numbers on a shared, loaded machine are
indicative only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np

from labs.async_lab import config, phases, plot, predict
from minirl.scale_out.async_loop import run

OUT = Path("runs/bench_async")


def arms(ray: bool) -> dict[str, dict]:
    """The runs to compare, as ``TrainConfig`` overrides: in process, and (``ray``) on actors with
    1 and 2 rollout actors."""
    out = {"sync": {"mode": "sync"}, "async": {"mode": "async", "max_staleness": 1}}
    if ray:
        for actors in (1, 2):  # 2 actors + trainer at 0.5 CPU each fit the 2-core cluster
            for name, s in (("lockstep", 0), ("async", 1)):
                out[f"ray-{name}-{actors}"] = {"mode": "ray", "max_staleness": s, "rollout_actors": actors,
                                               "cpus_per_actor": 0.5 if actors > 1 else 1.0}
        out["ray-async-2-longest-first"] = {**out["ray-async-2"], "dispatch": "longest_first"}
    return out


def ray_points(step: dict[str, float], ph: dict) -> dict[int, dict[str, float]]:
    """Measured Ray async/lockstep per actor count next to the cost model's prediction for the
    same split (strong scaling: the step's 8 groups divided over the actors)."""
    rng, out = np.random.default_rng(0), {}
    for actors in (1, 2):
        if f"ray-async-{actors}" in step:
            sync_t, async_t = predict(ph, actors, 8 // actors, rng)
            out[actors] = {"measured": step[f"ray-lockstep-{actors}"] / step[f"ray-async-{actors}"],
                           "cost_model": sync_t / async_t}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ray", action="store_true", help="add the Ray runs (1 and 2 rollout actors)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, arm in arms(args.ray).items():
        print(f"running {name} ...", flush=True)
        results[name] = run(dataclasses.replace(config(args.steps, str(OUT / name)), **arm))
        results[name].timeline.figure(results[name].queue_stats["depth"], title=name).savefig(OUT / f"timeline_{name}.png")
    s, a = results["sync"], results["async"]
    step = {m: statistics.mean(r["time_step"] for r in results[m].rows[1:]) for m in results}
    ph = phases(s)
    rng = np.random.default_rng(0)
    model = {w: (lambda st: st[0] / st[1])(predict(ph, w, 8, rng)) for w in (1, 2, 8, 64, 512)}
    report = {
        "samples_per_s": {"sync": s.samples_per_s, "async": a.samples_per_s, "ratio": a.samples_per_s / s.samples_per_s},
        "wall_s_per_step": {**step, "ratio": step["sync"] / step["async"]},
        "final_reward": {m: statistics.mean(r["reward"] for r in results[m].rows[-3:]) for m in results},
        "staleness_hist_async": a.staleness_hist,
        "phases_sync_per_step_s": {k: v for k, v in ph.items() if k != "group_gen_s"},
        "busy_idle": {m: results[m].timeline.busy_idle() for m in results},
        "cost_model_speedup": model,
        "ray_async_vs_lockstep": ray_points(step, ph),
    }
    plot(ph, report["wall_s_per_step"]["ratio"], [1, 2, 8, 64, 512], report["ray_async_vs_lockstep"]).savefig(OUT / "cost_model.png")
    (OUT / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "busy_idle"}, indent=1, default=str))


if __name__ == "__main__":
    main()
