"""``make reproduce``: each seed paper's finding re-measured here, paper's number next to ours.

One entry = one function decorated with ``@reproduction(name, finding=..., paper=...)``. It takes
``small`` (quick sizes for tests and ``--small``) and returns an ``Outcome``: our number as text,
datasets (written as netCDF) and figures (written as PNG). The runner times each entry, writes
``runs/reproduce/<name>/`` with ``summary.json`` (finding, paper, ours, command, wall seconds)
and prints one table. To add one, write one more decorated function at the bottom of this file.

    python -m labs.reproduce                 # every entry at full size
    python -m labs.reproduce --small         # quick sizes
    python -m labs.reproduce --only c3po --only roc
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import xarray as xr
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from minirl.quiet import quiet

OUT = Path("runs/reproduce")


@dataclass
class Outcome:
    ours: str
    datasets: dict[str, xr.Dataset] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)  # machine-readable, into summary.json


@dataclass(frozen=True)
class Reproduction:
    name: str
    finding: str
    paper: str  # the paper's number, with its source (paper, section / figure)
    run: Callable[[bool], Outcome]


REGISTRY: dict[str, Reproduction] = {}


def reproduction(name: str, *, finding: str, paper: str) -> Callable[[Callable[[bool], Outcome]], Callable[[bool], Outcome]]:
    """Register ``fn(small) -> Outcome`` as reproduction ``name``."""
    def wrap(fn: Callable[[bool], Outcome]) -> Callable[[bool], Outcome]:
        if name in REGISTRY:
            raise ValueError(f"reproduction {name!r} is registered twice")
        REGISTRY[name] = Reproduction(name, finding, paper, fn)
        return fn
    return wrap


def command(name: str, small: bool) -> str:
    return f"python -m labs.reproduce --only {name}" + (" --small" if small else "")


def run_one(rep: Reproduction, out: Path = OUT, small: bool = False) -> dict:
    """Run one entry, write its folder, return its summary (the dict written to summary.json)."""
    folder = out / rep.name
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with quiet(progress=False):  # the entries call labs quietly; this also stops the loader bars
        outcome = rep.run(small)  # those calls cause (transformers' "Loading weights", vLLM's shards)
    wall = time.perf_counter() - t0
    for key, ds in outcome.datasets.items():
        ds.to_netcdf(folder / f"{key}.nc", engine="h5netcdf")
    for key, fig in outcome.figures.items():
        fig.savefig(folder / f"{key}.png", dpi=110)
    summary = {"name": rep.name, "finding": rep.finding, "paper": rep.paper, "ours": outcome.ours,
               "command": command(rep.name, small), "wall_s": round(wall, 1), "small": small,
               "numbers": outcome.numbers, "files": sorted(p.name for p in folder.iterdir() if p.name != "summary.json")}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def table(summaries: list[dict]) -> pd.DataFrame:
    """The one table: finding, paper, ours, command, time."""
    return pd.DataFrame([{"finding": s["finding"], "paper": s["paper"], "ours": s["ours"],
                          "command": s["command"], "time": f"{s['wall_s']:.0f} s"} for s in summaries])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labs.reproduce", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="quick sizes (minutes, not tens of minutes)")
    ap.add_argument("--only", action="append", choices=sorted(REGISTRY), help="run only this entry (repeatable)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = ap.parse_args(argv)
    names = args.only or list(REGISTRY)
    summaries = [run_one(REGISTRY[n], args.out, args.small) for n in tqdm(names, desc="reproductions")]
    with pd.option_context("display.max_colwidth", 80, "display.width", 250):
        print(table(summaries).to_string(index=False))
    print(f"outputs: {args.out}/<name>/ (summary.json, *.nc, *.png)")
    return 0


def _tail_mean(da: xr.DataArray, frac: float = 0.25) -> float:
    """Mean over the last ``frac`` of the steps: where a training curve ends up."""
    n = max(1, int(round(da.sizes["step"] * frac)))
    return float(da.isel(step=slice(-n, None)).mean())


@reproduction("checklist", finding="Aligning each module closes the train-inference gap (Ring-linear §5.2.1 checklist)",
              paper="Ring-linear §5.2.1 / Fig. 10: each aligned module lowers the mismatch; no per-module number")
def _checklist(small: bool) -> Outcome:
    from labs import zoo
    from labs.alignment_checklist import knob_checklist, tp_drift
    from minirl import Knobs

    path, tokens = zoo.build("tiny-qwen3-moe"), 96 if small else 512
    fp32 = knob_checklist(path, train="hf", tokens=tokens)
    bf16 = knob_checklist(path, train="hf:bfloat16", tokens=tokens, target=Knobs.hf_exact())
    tp, tp_fig = tp_drift(path, dtype="bfloat16", train="bfloat16", knobs=Knobs.hf_exact(), tokens=tokens)
    top = fp32.table.drop(index="residual (dtype)")["share"].idxmax()
    ours = (f"vs fp32 trainer: {top} alone closes {fp32.table.loc[top, 'share']:.0%}, bf16 residual "
            f"{fp32.residual_gap / fp32.baseline_gap:.0%}; vs bf16 trainer: all knobs {bf16.baseline_gap:.2g} -> "
            f"{bf16.residual_gap:.2g}; TP=2 split reductions alone reopen {tp.loc[2, 'mean']:.2g}")
    as_ds = lambda t: xr.Dataset.from_dataframe(t.astype({"infer": str, "aligned": str}))  # noqa: E731
    return Outcome(ours, {"checklist_fp32_trainer": as_ds(fp32.table), "checklist_bf16_trainer": as_ds(bf16.table),
                          "tp_drift": xr.Dataset.from_dataframe(tp)},
                   {"checklist_fp32_trainer": fp32.figure, "checklist_bf16_trainer": bf16.figure, "tp_drift": tp_fig},
                   {"fp32_baseline_gap": fp32.baseline_gap, "fp32_residual_gap": fp32.residual_gap,
                    "bf16_baseline_gap": bf16.baseline_gap, "bf16_residual_gap": bf16.residual_gap,
                    "tp2_mean_gap": float(tp.loc[2, "mean"])})


@reproduction("decode_drift", finding="Prefill-vs-decode disparity worsens with longer outputs",
              paper="Ring-linear §5.2.1 (Attention): qualitative, grows with output length")
def _decode_drift(small: bool) -> Outcome:
    from labs import zoo
    from labs.alignment_checklist import decode_drift

    ds, fig = decode_drift(zoo.build("tiny-qwen3-moe"), n_prompts=4 if small else 8, new_tokens=24 if small else 96)
    gap = ds["dlogprob"].mean("sample")  # [mode, position]
    q = max(1, ds.sizes["position"] // 4)
    first, last = (float(gap.sel(mode="incremental").isel(position=s).mean()) for s in (slice(0, q), slice(-q, None)))
    rec = float(gap.sel(mode="recompute").mean())
    ours = (f"incremental decode: first quarter {first:.2g}, last quarter {last:.2g} mean |Δ logprob| "
            f"(recompute-every-step {rec:.2g}): {'grows' if last > 1.5 * first else 'no growth'} on this engine")
    return Outcome(ours, {"decode_drift": ds}, {"decode_drift": fig},
                   {"incremental_first_quarter": first, "incremental_last_quarter": last, "recompute_mean": rec})


@reproduction("c3po", finding="C3PO++ budgeted rollouts cut rollout-phase time per step",
              paper="Ring-1T §2.4.2 / Fig. 7: ~2.5x rollout-phase speedup per step")
def _c3po(small: bool) -> Outcome:
    from labs import c3po_lab

    kw = dict(steps=3, batch=8, max_new_tokens=48, chunk=16) if small else dict(steps=4, batch=16, max_new_tokens=256, chunk=32)
    c = c3po_lab.compare(**kw)
    pre = c.summary()["prefill_per_sampled"]
    ours = (f"{c.speedup:.2f}x per step, {c.speedup_per_token:.2f}x per trained token (CPU engine; a resume "
            f"re-prefills: {pre['C3PO++']:.1f} vs {pre['synchronous']:.2f} prefilled tokens per sampled token)")
    steps = xr.Dataset.from_dataframe(c.steps.set_index(["arm", "step"]))
    steps.attrs = {k: str(v) for k, v in c.config.items()}
    return Outcome(ours, {"steps": steps, "version_share": xr.DataArray(c.version_share).to_dataset(name="share")},
                   {"c3po": c.figure()},
                   {"speedup_per_step": c.speedup, "speedup_per_token": c.speedup_per_token, "paper_speedup": c3po_lab.PAPER_SPEEDUP})


@reproduction("c3po_reward", finding="C3PO++ with the trainer in the loop keeps the baseline's reward",
              paper="Ring-1T §2.4.2 / Fig. 8: C3PO++'s reward curve stays close to the baseline's")
def _c3po_reward(small: bool) -> Outcome:
    from labs import c3po_lab

    kw = (dict(steps=3, prompts_per_step=4, group_size=4, max_new_tokens=32, max_length=12) if small
          else dict(steps=30, prompts_per_step=8, group_size=4, max_new_tokens=64, max_length=24))
    with tempfile.TemporaryDirectory() as runs:  # the run logs; the comparison comes back in ``t``
        t = c3po_lab.compare_training(**kw, progress=False, out_dir=runs)
    s = t.summary()
    ours = (f"mean training reward {s.loc['synchronous', 'reward']:.2f} (sync) vs {s.loc['C3PO++', 'reward']:.2f} "
            f"(C3PO++), held-out accuracy {s.loc['synchronous', 'eval_accuracy']:.2f} vs "
            f"{s.loc['C3PO++', 'eval_accuracy']:.2f}; rollout phase {t.rollout_speedup:.2f}x")
    steps = xr.Dataset.from_dataframe(t.steps.set_index(["arm", "step"]))
    steps.attrs = {k: str(v) for k, v in t.config.items()}
    return Outcome(ours, {"steps": steps}, {"c3po_reward": t.figure()},
                   {"reward_sync": float(s.loc["synchronous", "reward"]), "reward_c3po": float(s.loc["C3PO++", "reward"]),
                    "eval_sync": float(s.loc["synchronous", "eval_accuracy"]),
                    "eval_c3po": float(s.loc["C3PO++", "eval_accuracy"]), "rollout_speedup": t.rollout_speedup})


@reproduction("roc", finding="GRPO-RoC keeps lowering tool errors in correct trajectories; GRPO plateaus",
              paper="rStar2-Agent §2.2.3 / Fig. 4: GRPO plateaus at ~10-15% tool-error ratio in positives, RoC keeps falling")
def _roc(small: bool) -> Outcome:
    from labs import roc_lab

    run = roc_lab.train(**(dict(steps=8, prompts_per_step=4, group_size=4) if small else {}))
    err = run.curves["error_ratio_positives"]
    start = {a: float(err.sel(arm=a).isel(step=slice(0, 3)).mean()) for a in ("GRPO", "GRPO-RoC")}
    end = {a: _tail_mean(err.sel(arm=a)) for a in ("GRPO", "GRPO-RoC")}
    ours = (f"scripted tabular policy, real sandbox: GRPO {start['GRPO']:.0%} -> {end['GRPO']:.0%}, "
            f"GRPO-RoC {start['GRPO-RoC']:.0%} -> {end['GRPO-RoC']:.0%} (first 3 steps -> last quarter)")
    return Outcome(ours, {"curves": run.curves}, {"roc_fig4": run.figure},
                   {f"{a}_{k}": v[a] for k, v in (("start", start), ("end", end)) for a in v})


@reproduction("router_replay", finding="R3 router replay shrinks the train-inference logprob gap of an MoE",
              paper="CompassMax §2.4.4: replay cuts the logprob discrepancy from ~1e-3 to ~1e-4 (~10x)")
def _router_replay(small: bool) -> Outcome:
    from labs import routing_lab

    pair = routing_lab.load(tokens=96 if small else 512)
    cmp = pair.compare()
    margins = routing_lab.flip_margins(pair, list(cmp.routing.index))
    res = routing_lab.replay_gap(pair.engine, pair.trainer, **(dict(prompts=4, n=2, max_new_tokens=16) if small
                                                               else dict(prompts=16, n=4, max_new_tokens=64)))
    s = res.summary
    aff = s.loc["no replay", "mean_affected"] / s.loc["R3", "mean_affected"]
    ours = (f"bf16 engine vs fp32 trainer, tiny MoE: {margins['flipped'].mean():.1%} token-layer flips (near-ties); "
            f"R3 cuts mean |Δ logprob| {res.reduction:.1f}x ({s.loc['no replay', 'mean']:.2g} -> {s.loc['R3', 'mean']:.2g}), "
            f"{aff:.1f}x on tokens after a flip; R2 1.0x by construction")
    return Outcome(ours, {"replay_per_token": xr.Dataset.from_dataframe(res.per_token.astype({"affected": int})),
                          "routing": xr.Dataset.from_dataframe(cmp.routing)},
                   {"routing_flips": routing_lab.flip_figure(cmp.routing, margins), "replay_gap": routing_lab.replay_figure(res)},
                   {"reduction_mean": res.reduction, "reduction_affected": float(aff),
                    "paper_reduction": routing_lab.PAPER_REDUCTION, "flip_share": float(margins["flipped"].mean())})


@reproduction("router_replay_deep", finding="R3 on an MoE shaped like real ones (16 layers, 64 experts top-8) vs the "
              "4-layer top-2 toy, with bf16 and fp8 rollouts",
              paper="CompassMax §2.4.4: replay cuts the logprob discrepancy from ~1e-3 to ~1e-4 (~10x)")
def _router_replay_deep(small: bool) -> Outcome:
    from labs import routing_lab

    summary, flips = routing_lab.depth_comparison(**(dict(prompts=2, n=2, max_new_tokens=8) if small
                                                     else dict(prompts=8, n=4, max_new_tokens=32)), progress=False)
    factor = summary["R3_factor_mean"]
    ours = "; ".join(f"{model} {rollout}: R3 {factor[model, rollout]:.2f}x on the mean, "
                     f"{summary.loc[(model, rollout), 'R3_factor_max']:.2f}x on the max, "
                     f"{summary.loc[(model, rollout), 'flip_rate']:.1%} flips" for model, rollout in summary.index)
    per_layer = xr.DataArray(flips.to_numpy(), dims=("layer", "run"), coords={
        "layer": flips.index.to_numpy(), "run": [f"{m} {r}" for m, r in flips.columns]}).to_dataset(name="flip_rate")
    return Outcome(ours, {"summary": xr.Dataset.from_dataframe(summary), "flips_per_layer": per_layer},
                   {"router_replay_deep": routing_lab.depth_figure(summary, flips)},
                   {f"R3_factor_mean {m} {r}": float(v) for (m, r), v in factor.items()})


@reproduction("quantized_rollouts", finding="GRPO vs TIS vs IcePop vs MIS with FP8 and INT4 rollouts against an fp32 trainer",
              paper="Ring-1T Figs 10-12: uncorrected GRPO's grad norm grows, IcePop stays stable; FlashRL: TIS recovers "
                    "the bf16-rollout curve with INT8/FP8 rollouts")
def _quantized_rollouts(small: bool) -> Outcome:
    from labs import quant_lab

    # --small keeps the full size's 100-step SFT warm start (cached per base model): with a 4-step one no
    # sample was ever right, every group had zero variance and no arm took a single gradient step
    ds = quant_lab.train_arms(**(dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=4, n_eval=4,
                                      eval_every=1) if small else {}), progress=False)
    acc = {(str(f), str(a)): _tail_mean(ds["eval_accuracy"].sel(weights=f, arm=a).dropna("step"))
           for f in ds["weights"].values for a in ds["arm"].values}
    grad = ds["grad_norm"].max("step")
    ours = "; ".join(f"{f}: " + ", ".join(f"{a} acc {acc[f, a]:.2f} (max grad {float(grad.sel(weights=f, arm=a)):.2g})"
                                           for a in quant_lab.ARMS) for f in map(str, ds["weights"].values))
    return Outcome(ours, {"curves": ds}, {"quantized_rollouts": quant_lab.curves_figure(ds)},
                   {f"eval_accuracy_tail {f} {a}": v for (f, a), v in acc.items()})


@reproduction("icepop", finding="IcePop masks a small share of tokens under a train-inference mismatch",
              paper="Ring-1T §2.3.4 / Fig. 12: 1-2‰ of training tokens clipped (masked)")
def _icepop(small: bool) -> Outcome:
    from labs import icepop_lab

    noise = 0.15
    ds = icepop_lab.train_arms(**(dict(steps=4, prompts_per_step=4, group_size=4, max_new_tokens=6) if small
                                  else dict(steps=30, prompts_per_step=8, group_size=8, max_new_tokens=8)),
                               weight_noise=noise, progress=False)
    sweep = icepop_lab.masked_share_sweep(**(dict(prompts=64, n=8) if small else {}))
    s = icepop_lab.summary(ds)
    ours = (f"weight noise {noise} on a bf16 engine vs fp32 trainer: IcePop masked {s.loc['IcePop', 'masked_permille']:.1f}‰ "
            f"in training (mismatch KL {s.loc['IcePop', 'mismatch_kl_k3']:.2g}); sweep: bf16 alone "
            f"{sweep['icepop_masked_permille'].iloc[0]:.1f}‰, noise {sweep.index[-1]:g} "
            f"{sweep['icepop_masked_permille'].iloc[-1]:.0f}‰")
    return Outcome(ours, {"curves": ds, "sweep": xr.Dataset.from_dataframe(sweep)},
                   {"icepop_curves": icepop_lab.figure(ds), "masked_sweep": icepop_lab.sweep_figure(sweep)},
                   {"icepop_masked_permille": float(s.loc["IcePop", "masked_permille"]),
                    "bf16_only_masked_permille": float(sweep["icepop_masked_permille"].iloc[0])})


@reproduction("async", finding="1-step-off asynchronous RL is faster per step than synchronous",
              paper="AsyncFlow §6.2 / Fig. 10: 1.59x average throughput over verl (32-1024 NPUs)")
def _async(small: bool) -> Outcome:
    from labs import async_lab

    c = async_lab.compare(**(dict(steps=3, prompts_per_step=4, group_size=2, max_new_tokens=16) if small else {}),
                          with_ray=not small)  # a local Ray cluster takes ~30 s to start: full size only
    table, model_fig = c.cost_model()
    s = c.summary()
    ray = (f", {s.loc['ray', 'speedup']:.2f}x on Ray actors (1-step-off, separate processes)" if "ray" in s.index
           else "; Ray arm not run at --small")
    ours = (f"{c.speedup:.2f}x per step on 2 shared CPU cores (sync vs 1-step-off in one process){ray}; cost model "
            f"{table.loc[64, 'speedup']:.2f}x at 64 rollout workers")
    return Outcome(ours, {"summary": xr.Dataset.from_dataframe(c.summary()), "cost_model": xr.Dataset.from_dataframe(table)},
                   {**{f"timeline_{m}": f for m, f in c.timelines().items()}, "cost_model": model_fig},
                   {"speedup": c.speedup, "paper_speedup": async_lab.PAPER_SPEEDUP})


REAL_MODEL_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "real_model_rl.yaml"


@reproduction("real_model_rl", finding="GRPO + IcePop with real vLLM bf16 rollouts and an fp32 trainer raises a real "
              "instruct model's held-out accuracy (SmolLM2-135M-Instruct, 2-digit ± 1-digit chat arithmetic)",
              paper="Ring-1T §2.3.4 / Fig. 11: with IcePop, RL on a real model under the bf16 train-inference "
                    "mismatch keeps improving its benchmark score; no number at this scale")
def _real_model_rl(small: bool) -> Outcome:
    """``configs/real_model_rl.yaml`` as shipped (``--small``: 2 steps of 2 x 4 rollouts, 16 held-out
    problems, so the whole path - zoo build, vLLM, trainer, evaluation - runs in minutes)."""
    from labs import zoo
    from minirl.training import run_log
    from minirl.training.driver import train
    from minirl.training.train_config import TrainConfig

    sizes = dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=16, n_eval=16, eval_every=1,
                 checkpoint_every=0) if small else {}
    with tempfile.TemporaryDirectory() as out:  # the run's checkpoint is not needed; its log comes back
        cfg = dataclasses.replace(TrainConfig.from_yaml(REAL_MODEL_CONFIG), model=str(zoo.build("smollm2-135m")),
                                  out_dir=out, progress=False, **sizes)
        log = run_log.to_dataset(train(cfg).rows)
    acc = log["eval_accuracy"].swap_dims(row="step").dropna("step")
    start, end = float(acc.isel(step=0)), float(acc.isel(step=-1))
    step_s = float(sum(log[k] for k in log.data_vars if k.startswith("time_")).mean())  # rollout + learn + sync
    ours = (f"held-out greedy accuracy {start:.1%} -> {end:.1%} ({100 * (end - start):+.1f} points) after "
            f"{int(acc['step'][-1])} of {cfg.steps} steps on {cfg.n_eval} problems; {step_s:.0f} s a step on this box")
    return Outcome(ours, {"metrics": log}, {"real_model_rl_curve": real_model_figure(log)},
                   {"eval_accuracy_start": start, "eval_accuracy_end": end, "gain_points": 100 * (end - start),
                    "step_s_mean": step_s})


def real_model_figure(log: xr.Dataset) -> Figure:
    """Held-out greedy accuracy per evaluated step, with the training reward (sampled at the
    config's temperature) beside it: the reward moves first, the held-out curve is the claim."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    by_step = log.swap_dims(row="step")
    acc = by_step["eval_accuracy"].dropna("step")
    ax.plot(acc["step"], 100 * acc, marker="o", label="held-out accuracy (greedy)")
    ax.plot(by_step["step"], 100 * by_step["reward"], marker=".", alpha=0.6, label="training reward (sampled)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("%")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("SmolLM2-135M-Instruct, GRPO + IcePop, vLLM bf16 rollouts")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
