"""Sync vs 1-step-off (async) vs Ray RL loops, their timelines and a cost model (AsyncFlow §3-4).

AsyncFlow §6.2 / Fig. 10 reports an average 1.59x throughput gain of its asynchronous
producer-consumer workflow over the verl baseline on 32-1024 NPUs. The gain comes from hiding the trainer behind
generation (and vice versa); on one machine with two cores both compete for the same CPUs, so
the measured ratio here is a lower bound and the cost model (``predict`` below:
measured phase times, long-tail generation, N rollout workers) says what the same schedule gives
when rollout and training run on separate hardware. The loop is ``minirl.scale_out.async_loop.run``; this module holds the
run's config (the ``longtail_sorting`` task), the phase split, the cost model and its plot, which
``benchmarks/bench_async.py`` and notebook 09 share.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from labs import zoo
from minirl.scale_out.async_loop import LoopResult, run
from minirl.scale_out.timeline import staleness_figure
from minirl.training.train_config import TrainConfig

PAPER_SPEEDUP = 1.59  # AsyncFlow §6.2 / Fig. 10: average throughput gain over the verl baseline
WORKERS = [1, 2, 8, 64, 512]


def config(steps: int, out: str) -> TrainConfig:
    return TrainConfig(model=str(zoo.build("tiny-qwen3")), sft_steps=150, task="longtail_sorting", task_kwargs={},
                       prompts_per_step=8, group_size=4, max_new_tokens=32, steps=steps, minibatches=2,
                       n_train=400, n_eval=0, eval_every=0, checkpoint_every=0, progress=False, out_dir=out)


def phases(result: LoopResult) -> dict[str, float]:
    """Per-step busy seconds of each stage (excluding step 0, the pipeline's warm-up)."""
    steps = sorted({s[3] for s in result.timeline.spans if s[0] == "train"})[1:]
    per = {}
    for stage in ("rollout", "reward", "train", "sync"):
        per[stage] = sum(e - b for name, b, e, k in result.timeline.spans if name == stage and k in steps) / len(steps)
    per["group_gen_s"] = [e - b for name, b, e, k in result.timeline.spans if name == "rollout"]
    tokens = statistics.mean(r["length"] for r in result.rows) * 32  # prompts * group per step
    per["gen_per_token_s"] = per["rollout"] / tokens
    per["update_per_token_s"] = per["train"] / tokens
    return per


def predict(ph: dict, workers: int, groups_per_worker: int, rng: np.random.Generator, trials: int = 2000
            ) -> tuple[float, float]:
    """Step time (sync, async) with ``workers`` rollout workers, each generating
    ``groups_per_worker`` groups per step (weak scaling: the global batch grows with workers and
    the trainer is scaled data-parallel with it, so its per-step time stays measured).

    Generation of a step ends when the *slowest* worker does: the expected maximum over workers
    of their summed group times, drawn from the measured long-tail distribution. Weight sync grows
    with log2(workers) (a broadcast tree). sync = gen + reward + train + sync;
    async (1-step-off) = max(gen + reward, train + sync): each side hides behind the other.
    """
    draws = rng.choice(np.array(ph["group_gen_s"]), size=(trials, workers, groups_per_worker)).sum(-1)
    gen = float(draws.max(-1).mean())
    sync_cost = ph["sync"] * (1 + np.log2(workers))
    return gen + ph["reward"] + ph["train"] + sync_cost, max(gen + ph["reward"], ph["train"] + sync_cost)


def plot(ph: dict, measured: float, workers: list[int], ray: dict[int, dict[str, float]]) -> Figure:
    rng = np.random.default_rng(0)
    ratios = [s / a for s, a in (predict(ph, w, 8, rng) for w in workers)]
    fig = Figure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    ax.plot(workers, ratios, marker="o", label="cost model: async / sync step time")
    ax.scatter([1], [measured], color="C3", zorder=3, label="measured in process (threads, this machine)")
    if ray:
        ax.scatter(list(ray), [p["measured"] for p in ray.values()], color="C2", marker="s", zorder=3,
                   label="measured on Ray actors (this machine)")
        ax.scatter(list(ray), [p["cost_model"] for p in ray.values()], facecolors="none", edgecolors="C2",
                   marker="s", zorder=3, label="cost model, same split of one step's groups")
    ax.axhline(1.59, color="grey", ls="--", lw=1, label="AsyncFlow avg. 1.59x (cluster)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollout workers")
    ax.set_ylabel("speedup")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


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

    def staleness(self) -> Figure:
        """Share of trained tokens per staleness, one bar per mode: sync trains on fresh tokens
        only, 1-step-off on tokens at most ``max_staleness`` updates old (AsyncFlow §4.2.2)."""
        return staleness_figure({m: r.staleness_hist for m, r in self.results.items()})

    def stale_share(self) -> dict[str, float]:
        """Per mode: share of trained tokens sampled on weights older than the learner's."""
        return {m: sum(n for k, n in r.staleness_hist.items() if k > 0) / max(sum(r.staleness_hist.values()), 1)
                for m, r in self.results.items()}

    def cost_model(self) -> tuple[pd.DataFrame, Figure]:
        """Predicted async/sync speedup per rollout-worker count from the sync run's phase times."""
        ph = phases(self.results["sync"])
        rng = np.random.default_rng(0)
        rows = {w: dict(zip(("sync_s", "async_s"), predict(ph, w, 8, rng))) for w in WORKERS}
        table = pd.DataFrame.from_dict(rows, orient="index")
        table["speedup"] = table["sync_s"] / table["async_s"]
        table.index.name = "workers"
        return table, plot(ph, self.speedup, WORKERS, {})


def compare(steps: int = 8, prompts_per_step: int = 8, group_size: int = 4, max_new_tokens: int = 32,
            with_ray: bool = True, out_dir: str | None = None) -> AsyncComparison:
    """Run ``config`` in each mode: ``sync``; ``async`` (1-step-off, producer thread); ``ray``
    (1-step-off with rollout and trainer in separate actor processes, so the overlap is not
    limited by one interpreter's GIL)."""
    root = Path(out_dir or tempfile.mkdtemp(prefix="async_lab_"))
    results, skipped = {}, {}
    modes = ["sync", "async"] + (["ray"] if with_ray else [])
    if not with_ray:
        skipped["ray"] = "with_ray=False"
    for mode in modes:
        cfg = dataclasses.replace(config(steps, str(root / mode)), prompts_per_step=prompts_per_step,
                                  group_size=group_size, max_new_tokens=max_new_tokens)
        if mode == "ray":
            reason = _ray_unavailable()
            if reason:
                skipped["ray"] = reason
                continue
        results[mode] = run(dataclasses.replace(cfg, mode=mode, max_staleness=0 if mode == "sync" else 1))
    return AsyncComparison(results, skipped)


def _ray_unavailable() -> str:
    """Why the Ray arm cannot run here ('' when it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'ray[default]')"
    return ""
