"""async (1-step-off, AsyncFlow §4.2.2) vs sync on a long-tail length task, plus a cost model.

    .venv/bin/python benchmarks/bench_async.py --steps 8

Prints samples/s and wall time per step of both modes and their ratio (goal >= 1.3x on 2
cores), the final reward of both, the measured phase times, and the cost model's predicted
async/sync speedup at 1/2/8/64/512 rollout workers; saves the timelines and the model's plot
under runs/bench_async/ (PNGs, not committed). Numbers on a shared, loaded machine are
indicative only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.async_loop import LoopConfig, LoopResult, run
from minirl.train_config import TrainConfig

OUT = Path("runs/bench_async")


def config(steps: int, out: str) -> TrainConfig:
    import labs.zoo

    return TrainConfig(model=str(labs.zoo.build("tiny-qwen3")), sft_steps=150, task="longtail_sorting", task_kwargs={},
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


def plot(ph: dict, measured: float, workers: list[int]) -> Figure:
    rng = np.random.default_rng(0)
    ratios = [s / a for s, a in (predict(ph, w, 8, rng) for w in workers)]
    fig = Figure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    ax.plot(workers, ratios, marker="o", label="cost model: async / sync step time")
    ax.scatter([1], [measured], color="C3", zorder=3, label="measured (1 worker, this machine)")
    ax.axhline(1.59, color="grey", ls="--", lw=1, label="AsyncFlow avg. 1.59x (cluster)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollout workers")
    ax.set_ylabel("speedup")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in ("sync", "async"):
        results[mode] = run(config(args.steps, str(OUT / mode)), LoopConfig(mode=mode, max_staleness=1))
        results[mode].timeline.figure(results[mode].queue_stats["depth"], title=mode).savefig(OUT / f"timeline_{mode}.png")
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
    }
    plot(ph, report["wall_s_per_step"]["ratio"], [1, 2, 8, 64, 512]).savefig(OUT / "cost_model.png")
    (OUT / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "busy_idle"}, indent=1, default=str))


if __name__ == "__main__":
    main()
