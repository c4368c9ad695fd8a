"""``make reproduce``: each seed paper's finding re-measured here, paper's number next to ours.

One entry = one function decorated with ``@reproduction(name, finding=..., paper=...)``. It takes
``small`` (quick sizes for tests and ``--small``) and returns an ``Outcome``: our number as text,
datasets (written as netCDF) and figures (written as PNG). The runner times each entry, writes
``runs/reproduce/<name>/`` with ``summary.json`` (finding, paper, ours, command, wall seconds)
and prints one table (also ``results.md``). To add one, write one more decorated function at the
bottom of this file.

An entry that claims something about learning runs ``SEEDS`` (``SMALL_SEEDS`` at ``--small``): one
run says little (two seeds of the real-model recipe went opposite ways). Its ``Outcome.seeded``
curves (dims ``seed``, ``step``) become ``bands`` in ``summary.json``: per step the mean over seeds,
its 95 % t-interval and every seed's value; its text quotes them. The seeds share the task's
held-out set (``train_seeds``), whose checksum the summary records.

    python -m labs.reproduce                 # every entry at full size
    python -m labs.reproduce --small         # quick sizes
    python -m labs.reproduce --only c3po --only roc
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from labs import allocator
from minirl.quiet import quiet
from minirl.training.plot import mean_ci

OUT = Path("runs/reproduce")
SEEDS = (0, 1, 2)  # each picks sampling, data order and init; the held-out set stays the task's one
SMALL_SEEDS = (0, 1)  # --small: still two, so the interval is computed wherever the entry runs
SPLIT_SEED = 0  # the train / held-out split every seed of an entry shares


@dataclass
class Outcome:
    ours: str
    datasets: dict[str, xr.Dataset] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)  # machine-readable, into summary.json
    seeded: dict[str, xr.DataArray] = field(default_factory=dict)  # (seed, step) curves -> summary "bands"
    held_out_sha256: str | None = None  # the held-out set the seeded curves are scored on


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
               "numbers": outcome.numbers, "bands": {k: band(v) for k, v in outcome.seeded.items()},
               "held_out_sha256": outcome.held_out_sha256,
               "files": sorted(p.name for p in folder.iterdir() if p.name != "summary.json")}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def table(summaries: list[dict]) -> pd.DataFrame:
    """The one table: finding, paper, ours, seeds (runs behind each curve), command, time."""
    return pd.DataFrame([{"finding": s["finding"], "paper": s["paper"], "ours": s["ours"],
                          "seeds": max((len(b["seeds"]) for b in s["bands"].values()), default=1),
                          "command": s["command"], "time": f"{s['wall_s']:.0f} s"} for s in summaries])


def markdown(summaries: list[dict]) -> str:
    """``table`` as a markdown table (``results.md``; the README's findings table is copied from it)."""
    t = table(summaries)
    cells = [list(t.columns), ["---"] * len(t.columns), *t.astype(str).to_numpy().tolist()]
    return "".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |\n" for row in cells)


def band(curve: xr.DataArray) -> dict:
    """A ``(seed, step)`` curve -> per step (where any seed has a value): the mean over seeds, its
    95 % t-interval (Student t with n - 1 degrees of freedom: a handful of seeds is far from the
    normal approximation; None with one seed) and each seed's value (None where it has none)."""
    curve = curve.transpose("seed", "step")
    values = curve.to_numpy().astype(np.float64)
    keep = np.isfinite(values).any(axis=0)
    values = values[:, keep]
    per_step = [mean_ci(column) for column in values.T]
    return {"seeds": [int(s) for s in curve["seed"].values], "step": [int(s) for s in curve["step"].values[keep]],
            "mean": [m for m, _ in per_step], "ci95": [ci for _, ci in per_step],
            "per_seed": {str(int(s)): [None if not math.isfinite(v) else float(v) for v in row]
                         for s, row in zip(curve["seed"].values, values)}}


def ci_text(mean: float, ci: list[float] | None, unit: str = "") -> str:
    """``mean [lo, hi]`` (``mean_ci``'s or a band step's), for an entry's text."""
    return f"{mean:.1f}{unit}" + ("" if ci is None else f" [{ci[0]:.1f}, {ci[1]:.1f}]")


def band_figure(curves: dict[str, xr.DataArray], ylabel: str, title: str, yscale: str = "linear") -> Figure:
    """One line per ``(seed, step)`` curve: the mean over seeds, its 95 % interval shaded (``band``);
    ``yscale="log"`` for curves an order of magnitude apart (the interval's part below 0 is not drawn)."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for label, curve in curves.items():
        b = band(curve)
        line, = ax.plot(b["step"], b["mean"], marker="o", label=f"{label} ({len(b['seeds'])} seeds)")
        shown = [(s, ci) for s, ci in zip(b["step"], b["ci95"]) if ci is not None]
        if shown:
            ax.fill_between([s for s, _ in shown], [ci[0] for _, ci in shown], [ci[1] for _, ci in shown],
                            color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    ax.set_yscale(yscale)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    return fig


def held_out_sha256(problems: list) -> str:
    """Checksum of a held-out set (prompts and answers, in order): which problems a curve is scored on."""
    return hashlib.sha256(json.dumps([[p.prompt, p.answer] for p in problems]).encode()).hexdigest()


def train_seeds(cfg, seeds: tuple[int, ...]) -> tuple[xr.Dataset, str]:  # noqa: ANN001 - a TrainConfig
    """Run ``cfg`` (``mode: sync``) once per seed on the task's one split (drawn with ``SPLIT_SEED``):
    every seed is scored on the same held-out problems, so the band is the runs' spread, not the
    held-out draws' (the seed alone would redraw the split). -> the run logs stacked on a ``seed``
    dim (by step), the held-out set's ``held_out_sha256``."""
    from minirl import tasks
    from minirl.training import run_log
    from minirl.training.trainer import Trainer

    if cfg.mode != "sync":
        raise ValueError(f"train_seeds runs the sync Trainer loop; mode={cfg.mode!r} is not supported")
    split = tasks.splits(tasks.get(cfg.task, **cfg.task_kwargs), cfg.n_train, cfg.n_eval, SPLIT_SEED)
    logs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as out:  # the run's checkpoint is not needed; its log comes back
            trainer = Trainer(dataclasses.replace(cfg, seed=seed, out_dir=out))
            trainer.train_set, trainer.eval_set = split
            logs.append(run_log.to_dataset(trainer.run().rows).swap_dims(row="step"))
    return xr.concat(logs, pd.Index(list(seeds), name="seed"), join="outer"), held_out_sha256(split[1])


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # started as a program: on tcmalloc, as every long run should be (labs.allocator)
        allocator.relaunch()
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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(markdown(summaries))
    print(f"outputs: {args.out}/<name>/ (summary.json, *.nc, *.png), {args.out}/results.md")
    return 0


def _tail_mean(da: xr.DataArray, frac: float = 0.25) -> xr.DataArray:
    """Mean over the last ``frac`` of the steps (per seed, per arm): where a training curve ends up."""
    n = max(1, int(round(da.sizes["step"] * frac)))
    return da.isel(step=slice(-n, None)).mean("step")


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

    seeds = SMALL_SEEDS if small else SEEDS
    runs = [roc_lab.train(**(dict(steps=8, prompts_per_step=4, group_size=4) if small else {}), seed=s) for s in seeds]
    curves = xr.concat([r.curves for r in runs], pd.Index(list(seeds), name="seed"), combine_attrs="drop_conflicts")
    err = 100 * curves["error_ratio_positives"]  # (seed, arm, step), %
    arms = ("GRPO", "GRPO-RoC")
    start = {a: mean_ci(err.sel(arm=a).isel(step=slice(0, 3)).mean("step").values) for a in arms}
    end = {a: mean_ci(_tail_mean(err.sel(arm=a)).values) for a in arms}
    ours = (f"scripted tabular policy, real sandbox, % tool errors in positives: "
            + ", ".join(f"{a} {ci_text(*start[a])} -> {ci_text(*end[a])}" for a in arms)
            + f" (first 3 steps -> last quarter; mean [95% CI] over {len(seeds)} seeds)")
    seeded = {f"error_ratio_positives {a}": curves["error_ratio_positives"].sel(arm=a) for a in arms}
    return Outcome(ours, {"curves": curves},
                   {"roc_fig4": band_figure({a: err.sel(arm=a) for a in arms}, "tool-error ratio in positives (%)",
                                            "GRPO vs GRPO-RoC")},
                   {f"{a}_{k}": v[a][0] / 100 for k, v in (("start", start), ("end", end)) for a in arms}, seeded)


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
    acc = {(str(f), str(a)): float(_tail_mean(ds["eval_accuracy"].sel(weights=f, arm=a).dropna("step")))
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


@reproduction("mismatch_growth", finding="The train-inference mismatch grows during RL, per site, faster without a "
              "correction (the run's mismatch monitor, quantized rollouts, GRPO vs IcePop, same seed)",
              paper="Ring-1T §2.3.4: the mismatch compounds as training goes on, and IcePop keeps it in check; "
                    "CompassMax §2.4.4: routing drift is what blows it up in MoE; no per-site numbers")
def _mismatch_growth(small: bool) -> Outcome:
    """Two arms of one config, ``correction: none`` and ``icepop``, with the monitor on: smollm2-135m
    with vLLM-style fp8 W8A8 rollouts (per-tensor weights, per-token activations) against the fp32
    trainer, from the instruct model as is (no SFT, as ``configs/real_model_rl.yaml``), 40 steps read
    every 5 (``--small``: the tiny MoE with int8 rollouts, 4 steps read every 2)."""
    import minirl
    from labs import zoo
    from minirl.training import monitor_report, run_log

    if small:
        base = dict(model=str(zoo.build("tiny-qwen3-moe")), task="arithmetic", n_train=64, n_eval=8, prompts_per_step=4,
                    group_size=4, max_new_tokens=6, lr=1e-3, steps=4, monitor_every=2,
                    engine="minirl:typical,weights=int8")
    else:
        base = dict(model=str(zoo.build("smollm2-135m")), task="chat_arithmetic",
                    task_kwargs={"digits": 2, "second_digits": 1}, n_train=1000, n_eval=64, prompts_per_step=4,
                    sft_steps=0, group_size=8, max_new_tokens=32, temperature=0.7, lr=2e-5, zero_variance="filter",
                    steps=40, monitor_every=5, engine="minirl:typical,weights=fp8_e4m3_tensor,activations=fp8")
    arms = {"without a correction": "none", "with IcePop": "icepop"}
    logs = {}
    for arm, correction in arms.items():
        with tempfile.TemporaryDirectory() as out:
            cfg = minirl.TrainConfig(**base, correction=correction, eval_every=0, checkpoint_every=0, out_dir=out,
                                     progress=False)
            logs[arm] = run_log.load(minirl.train(cfg).log_path).load()
    kinds = monitor_report.site_kinds(logs["without a correction"])
    ours = "; ".join(monitor_report.compare_growth(logs, kind) for kind in [None, *kinds])
    ours += f". Without a correction: {monitor_report.sentence(logs['without a correction'])}"
    growth = {(arms[a], kind): monitor_report.median_growth(ds, kind) for a, ds in logs.items() for kind in [None, *kinds]}
    return Outcome(ours, {f"monitor_{arms[a]}": ds for a, ds in logs.items()},
                   {"mismatch_growth_kinds": monitor_report.kinds_figure(logs),
                    **{f"mismatch_growth_{arms[a]}": monitor_report.figure(ds) for a, ds in logs.items()}},
                   {f"median_{kind or 'site'}_error_factor {arm}": math.exp(g.last - g.first)
                    for (arm, kind), g in growth.items() if g})


REAL_MODEL_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "real_model_rl.yaml"


@reproduction("real_model_rl", finding="GRPO + IcePop with real vLLM bf16 rollouts and an fp32 trainer raises a real "
              "instruct model's held-out accuracy (SmolLM2-135M-Instruct, 2-digit ± 1-digit chat arithmetic)",
              paper="Ring-1T §2.3.4 / Fig. 11: with IcePop, RL on a real model under the bf16 train-inference "
                    "mismatch keeps improving its benchmark score; no number at this scale")
def _real_model_rl(small: bool) -> Outcome:
    """``configs/real_model_rl.yaml`` as shipped, once per seed on one held-out set (``--small``: 2 steps
    of 2 x 4 rollouts, 16 held-out problems, so the whole path - zoo build, vLLM, trainer, evaluation,
    the band - runs in minutes)."""
    from labs import zoo
    from minirl.training.train_config import TrainConfig

    sizes = dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=16, n_eval=16, eval_every=1,
                 checkpoint_every=0) if small else {}
    cfg = dataclasses.replace(TrainConfig.from_yaml(REAL_MODEL_CONFIG), model=str(zoo.build("smollm2-135m")),
                              progress=False, **sizes)
    seeds = SMALL_SEEDS if small else SEEDS
    log, checksum = train_seeds(cfg, seeds)
    acc = 100 * log["eval_accuracy"].dropna("step", how="all")  # (seed, step), %
    gain = mean_ci((acc.isel(step=-1) - acc.isel(step=0)).values)
    start, end = mean_ci(acc.isel(step=0).values), mean_ci(acc.isel(step=-1).values)
    per_seed = ", ".join(f"{float(acc.sel(seed=s).isel(step=0)):.1f} -> {float(acc.sel(seed=s).isel(step=-1)):.1f}"
                         for s in seeds)
    step_s = float(sum(log[k] for k in log.data_vars if k.startswith("time_")).mean())  # rollout + learn + sync
    ours = (f"held-out greedy accuracy {ci_text(*start, ' %')} -> {ci_text(*end, ' %')}, gain "
            f"{ci_text(*gain, ' points')} (mean [95% CI] over {len(seeds)} seeds: {per_seed}) after "
            f"{int(acc['step'][-1])} of {cfg.steps} steps on {cfg.n_eval} problems; {step_s:.0f} s a step on this box")
    return Outcome(ours, {"metrics": log}, {"real_model_rl_curve": real_model_figure(log)},
                   {"eval_accuracy_start": start[0] / 100, "eval_accuracy_end": end[0] / 100,
                    "gain_points": gain[0], "step_s_mean": step_s},
                   {"eval_accuracy": acc / 100, "reward": log["reward"]}, checksum)


def real_model_figure(log: xr.Dataset) -> Figure:
    """Held-out greedy accuracy where evaluated, with the training reward (sampled at the config's
    temperature) beside it, each as its mean over seeds with the 95 % interval: the reward moves
    first, the held-out curve is the claim."""
    return band_figure({"held-out accuracy (greedy)": 100 * log["eval_accuracy"],
                        "training reward (sampled)": 100 * log["reward"]}, "%",
                       "SmolLM2-135M-Instruct, GRPO + IcePop, vLLM bf16 rollouts")


@reproduction("collapse", finding="Uncorrected GRPO collapses under a real quantized-rollout mismatch while TIS and "
              "IcePop stay stable (SmolLM2-135M-Instruct, bf16 trainer, int4-weight minirl rollouts, 200 steps)",
              paper="Ring-1T §2.3.4 / Fig. 10-11: the baseline's reward collapses after 180-200 steps and its gradient "
                    "norm explodes, IcePop and TIS stay stable over 600; the baseline's max |p_train - p_infer| grows")
def _collapse(small: bool) -> Outcome:
    """``configs/collapse.yaml`` once per arm and seed, the verdict computed from the curves by
    ``collapse_lab.RULE`` (``--small``: the tiny MoE, 2 steps, one seed per arm)."""
    from labs import collapse_lab

    ds, logs = collapse_lab.train_arms(small)
    table = collapse_lab.verdict(ds)
    numbers = {f"{k} {arm} seed{seed}": float(v) for (arm, seed), row in table.iterrows() for k, v in row.items()}
    return Outcome(collapse_lab.sentence(table), {"collapse": ds, **{f"log_{k}": v for k, v in logs.items()}},
                   {"collapse": collapse_lab.figure(ds)}, numbers)


@reproduction("three_engines", finding="vLLM, SGLang and minirl typical in bf16 against one fp32 trainer: per-site "
                                       "error, first divergence and the minirl knobs each engine's numerics match",
              paper="no paper publishes it (closest: Ring-linear §5.2.1's per-module checklist, one engine)")
def _three_engines(small: bool) -> Outcome:
    """``labs.three_engines`` on smollm2 at 256 tokens (``--small``: tiny-llama, 64 tokens, one
    fingerprint pass)."""
    from labs import three_engines, zoo

    path = zoo.build("tiny-llama" if small else "smollm2-135m")
    result = three_engines.three_engines(path, 64 if small else 256, passes=1 if small else 2)
    s = result.summary
    ours = "; ".join(f"{e}: logits rel-L2 {r.logits_rel_l2:.2g}, fingerprint {r.fingerprint_distance:.2g} nats "
                     f"({r.knobs_found})" for e, r in s.iterrows())
    sites = xr.Dataset({e.replace(":", "_"): ("site", result.sites[e].to_numpy()) for e in result.sites},
                       coords={"site": result.sites.index.to_numpy()})
    return Outcome(ours, {"three_engines_sites": sites, "three_engines": xr.Dataset.from_dataframe(s.astype(
        {"first_divergence": str, "knobs_found": str, "gap_start": str}))},
                   numbers={f"{k} {e}": float(v) for e, r in s.iterrows() for k, v in r.items()
                            if isinstance(v, float)})


@reproduction("fp16", finding="FP16 rollouts and training remove most of the BF16 train-inference mismatch",
              paper="Qi et al., arXiv 2510.26788, §3-4: FP16 on both sides removes most of the mismatch that BF16 "
                    "leaves; their sanity test reaches up to 99 % with FP16 where BF16 peaks at 73-88 %")
def _fp16(small: bool) -> Outcome:
    """``labs.precision_lab``: the same prompts and seeds sampled by minirl and scored by the
    trainer, both in bf16, then both in fp16, on smollm2 and Gemma 3 270M (``--small``: tiny-qwen3,
    2 seeds); the verdict by ``precision_lab.verdict``'s rule. Then the RL arms: GRPO with both
    sides in each dtype, 3 seeds x 100 steps on the tiny MoE (``--small``: 2 seeds x 2
    steps), verdict by ``precision_lab.RL_RULE``."""
    from labs import precision_lab, zoo

    models = ("tiny-qwen3",) if small else ("smollm2-135m", "gemma3-270m")
    kw = dict(prompts=4, new_tokens=16) if small else dict(prompts=16, new_tokens=64)
    tables = {m: precision_lab.compare(zoo.build(m), seeds=SMALL_SEEDS if small else SEEDS, **kw) for m in models}
    verdicts = {m: precision_lab.verdict(t) for m, t in tables.items()}
    rl = precision_lab.rl_arms(precision_lab.RL_SMALL if small else precision_lab.RLSizes(), _arms_dir("fp16", small),
                               SPLIT_SEED)
    rl_text, rl_numbers = precision_lab.rl_verdict(rl)
    curves = precision_lab.rl_curves(rl)
    return Outcome("; ".join(f"{m}: {text}" for m, (text, _) in verdicts.items()) + f". {rl_text}",
                   {**{f"fp16_{m}": xr.Dataset.from_dataframe(t) for m, t in tables.items()}, "fp16_rl": rl},
                   {"fp16": precision_lab.figure(tables),
                    "fp16_rl": band_figure(curves, "mean |Δ logprob|", "GRPO, both sides in one dtype", "log")},
                   {**{f"{k} {m}": v for m, (_, nums) in verdicts.items() for k, v in nums.items()}, **rl_numbers},
                   curves)


def _arms_dir(name: str, small: bool) -> Path:
    """Where an entry's resumable arms live: ``runs/reproduce/<name>/arms`` at full size (a killed
    entry resumes at its first arm not written), a fresh temporary folder at ``--small``."""
    return Path(tempfile.mkdtemp(prefix=f"{name}_arms_")) if small else OUT / name / "arms"


@reproduction("on_policy", finding="A setting where the trainer's recomputed log-probs equal the rollout engine's "
              "bit for bit at every RL step (max |Δ logprob| exactly 0), what it costs, and batch invariance",
              paper="Ring-linear §5.2.1: aligning each module closes the gap; no paper reports an exact 0 over RL steps")
def _on_policy(small: bool) -> Outcome:
    """``labs.on_policy_lab``: each ``SETTINGS`` entry as real RL steps on the tiny dense model and
    the tiny MoE over 3 seeds, verdict by ``on_policy_lab.RULE``; the batch-invariance count beside
    it (``--small``: tiny-qwen3, two settings, 2 seeds of 1 step, batch sizes 1, 3, 8)."""
    from labs import on_policy_lab

    sizes = on_policy_lab.SMALL if small else on_policy_lab.Sizes()
    ds = on_policy_lab.measure(sizes, _arms_dir("on_policy", small), SPLIT_SEED)
    table, numbers = on_policy_lab.verdict(ds)
    invariance = on_policy_lab.batch_invariance(sizes.models[0], sizes)
    numbers.update({f"distinct_greedy batch_invariant={k}": float(v) for k, v in invariance["distinct"].items()})
    as_ds = xr.Dataset.from_dataframe(table.drop(columns=["max_ci", "mean_ci"]))
    return Outcome(on_policy_lab.sentence(table, invariance), {"on_policy": ds, "verdict": as_ds,
                                                                "batch_invariance": xr.Dataset.from_dataframe(invariance)},
                   {"on_policy": on_policy_lab.figure(ds)}, numbers)


@reproduction("r3_layers", finding="Routing flips per layer and per token on a deep MoE (bf16 engine vs trainer), "
              "and the k3 KL with and without R3",
              paper="R3 (Ma et al., arXiv 2510.11370; section not checked here): ~10 % of routers flip per layer, 94 % of tokens flip in "
                    ">= 1 layer (Qwen3-30B-A3B); R3 lowers the training-inference KL")
def _r3_layers(small: bool) -> Outcome:
    """``labs.r3_layers_lab`` on the deep zoo MoE (16 layers, 64 experts top-8), fp32 and bf16
    trainers, 3 seeds (``--small``: the 4-layer MoE, fp32 trainer, 2 seeds of 2 x 2 rollouts)."""
    from labs import r3_layers_lab

    sizes = r3_layers_lab.SMALL if small else r3_layers_lab.Sizes()
    ds = r3_layers_lab.measure(sizes, _arms_dir("r3_layers", small))
    text, numbers = r3_layers_lab.verdict(ds)
    return Outcome(text, {"r3_layers": ds}, {"r3_layers": r3_layers_lab.figure(ds)}, numbers)


@reproduction("lr0", finding="At lr = 0 the train-inference mismatch stays flat; at the normal lr it grows "
              "(same seeds, tiny MoE, bf16 rollouts vs the fp32 trainer)",
              paper="Ring-1T §2.3.4: the mismatch compounds as training goes on; no lr = 0 control is reported")
def _lr0(small: bool) -> Outcome:
    """``labs.lr0_lab``: 12 RL steps per seed at lr 0 and at 1e-3, 3 seeds, verdict by ``lr0_lab.RULE``
    (``--small``: 3 steps of 2 x 2 rollouts, 2 seeds)."""
    from labs import lr0_lab

    ds = lr0_lab.measure(lr0_lab.SMALL if small else lr0_lab.Sizes(), _arms_dir("lr0", small), SPLIT_SEED)
    text, numbers = lr0_lab.verdict(ds)
    curves = lr0_lab.seeded(ds)
    return Outcome(text, {"lr0": ds}, {"lr0": band_figure(curves, "mean |Δ logprob|", "lr = 0 vs the normal lr")},
                   numbers, curves)


if __name__ == "__main__":
    sys.exit(main())
