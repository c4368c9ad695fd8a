"""Sync vs 1-step-off (async) vs Ray RL loops, their timelines and a cost model (AsyncFlow §3-4).

AsyncFlow §6.2 / Fig. 10 reports an average 1.59x throughput gain of its asynchronous
producer-consumer workflow over the verl baseline on 32-1024 NPUs. The gain comes from hiding the trainer behind
generation (and vice versa); on one machine with two cores both compete for the same CPUs, so
the measured ratio here is a lower bound and the cost model (``benchmarks/bench_async.py``:
measured phase times, long-tail generation, N rollout workers) says what the same schedule gives
when rollout and training run on separate hardware. This module only drives and summarises:
the loop is ``minirl.async_loop.run``, the task, config, phase split, cost model and its plot
are the benchmark's own functions.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from minirl.async_loop import LoopConfig, LoopResult, run

PAPER_SPEEDUP = 1.59  # AsyncFlow §6.2 / Fig. 10: average throughput gain over the verl baseline
REPO = Path(__file__).resolve().parent.parent
WORKERS = [1, 2, 8, 64, 512]


def bench() -> ModuleType:
    """``benchmarks/bench_async.py`` as a module (benchmarks/ is not an installed package).
    Importing it registers its long-tail sorting task; it is loaded once per process."""
    name = "benchmarks.bench_async"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "bench_async.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@dataclass
class AsyncComparison:
    """``results``: mode -> ``LoopResult``; ``skipped``: mode -> why it did not run."""

    results: dict[str, LoopResult]
    skipped: dict[str, str]

    def summary(self) -> pd.DataFrame:
        """Per mode: seconds per step (step 0, the warm-up, excluded), samples/s, final reward,
        and the speedup over sync per step."""
        rows = {m: {"s_per_step": statistics.mean(r["time_step"] for r in res.rows[1:] or res.rows),
                    "samples_per_s": res.samples_per_s, "reward_last": res.rows[-1]["reward"],
                    "max_staleness": max(res.staleness_hist, default=0)}
                for m, res in self.results.items()}
        out = pd.DataFrame.from_dict(rows, orient="index")
        out["speedup"] = out.loc["sync", "s_per_step"] / out["s_per_step"]
        out.index.name = "mode"
        return out

    @property
    def speedup(self) -> float:
        """sync / async seconds per step (AsyncFlow's 1.59x is this kind of ratio)."""
        return float(self.summary().loc["async", "speedup"])

    def timelines(self) -> dict[str, Figure]:
        return {m: r.timeline.figure(r.queue_stats.get("depth"), title=m) for m, r in self.results.items()}

    def cost_model(self) -> tuple[pd.DataFrame, Figure]:
        """Predicted async/sync speedup per rollout-worker count from the sync run's phase times."""
        b = bench()
        ph = b.phases(self.results["sync"])
        rng = np.random.default_rng(0)
        rows = {w: dict(zip(("sync_s", "async_s"), b.predict(ph, w, 8, rng))) for w in WORKERS}
        table = pd.DataFrame.from_dict(rows, orient="index")
        table["speedup"] = table["sync_s"] / table["async_s"]
        table.index.name = "workers"
        return table, b.plot(ph, self.speedup, WORKERS)


def compare(steps: int = 8, prompts_per_step: int = 8, group_size: int = 4, max_new_tokens: int = 32,
            with_ray: bool = True, out_dir: str | None = None) -> AsyncComparison:
    """Run the benchmark's config in each mode (``max_staleness=1`` for async; Ray lockstep)."""
    root = Path(out_dir or tempfile.mkdtemp(prefix="async_lab_"))
    b = bench()
    results, skipped = {}, {}
    modes = ["sync", "async"] + (["ray"] if with_ray else [])
    if not with_ray:
        skipped["ray"] = "with_ray=False"
    for mode in modes:
        cfg = dataclasses.replace(b.config(steps, str(root / mode)), prompts_per_step=prompts_per_step,
                                  group_size=group_size, max_new_tokens=max_new_tokens)
        loop = LoopConfig(mode=mode, max_staleness=1 if mode == "async" else 0)
        if mode == "ray":
            reason = _ray_unavailable()
            if reason:
                skipped["ray"] = reason
                continue
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
            loop = dataclasses.replace(loop, setup_modules=("benchmarks.bench_async",))
        results[mode] = run(cfg, loop)
    return AsyncComparison(results, skipped)


def _ray_unavailable() -> str:
    """Why the Ray arm cannot run here ('' when it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'ray[default]')"
    return ""
