"""Does uncorrected RL collapse under a real train-inference mismatch while TIS and IcePop stay stable?

Ring-1T Fig. 10-11: without a correction the reward collapses after 180-200 steps and the gradient
norm explodes, while IcePop and TIS stay stable over 600; the baseline's max |p_train - p_infer|
grows fast, IcePop's stays low. The zoo's tiny models never showed it (their quantized gap is 40x
smaller than a real model's and their completions are 2 tokens long). Here: ``configs/collapse.yaml``
(SmolLM2-135M-Instruct, a bf16 mixed-precision trainer, int4-weight minirl rollouts, chat arithmetic
answered in sentences, 200 steps), one ``minirl.train`` per arm (``correction: none | tis | icepop``)
and seed, and a verdict computed from each run's curves by ``RULE``. ``small`` runs the same path on
the zoo's tiny MoE in seconds (its int4 gap is tiny: nothing is expected to collapse there).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "collapse.yaml"
ARMS = ("none", "tis", "icepop")  # TrainConfig.correction of each arm
SEEDS = {"none": (0, 1), "tis": (0,), "icepop": (0, 1)}  # full size: two seeds where the paper's claim is
SMALL = dict(model="tiny-qwen3-moe", task="arithmetic", task_kwargs={"digits": 1}, sft_steps=100, n_train=64,
             n_eval=4, prompts_per_step=2, group_size=4, max_new_tokens=6, lr=1e-3, steps=2, eval_every=0,
             monitor_every=0, checkpoint_every=2, micro_batch_size=2)
"""``small``: the tiny MoE after its cached 100-step SFT, one seed per arm, 2 steps."""
MEASURED = Path(__file__).resolve().parent.parent / "docs" / "measurements" / "collapse.nc"
"""The full-size entry's per-step curves as measured here (``read_arms``, the page beside it says when and how)."""
COLORS = {"none": "#c0392b", "tis": "#f39c12", "icepop": "#2c7fb8"}
RULE = ("collapsed: the mean reward of the last tenth of the steps is below half the peak of the reward "
        "curve smoothed over a twentieth of the steps, or the gradient norm (the step's largest minibatch) "
        "exceeds 10x its median over the run at some step")
"""The verdict's rule, quoted in the outcome; ``verdict`` computes it."""


def config(small: bool = False, **changes: object):  # noqa: ANN201 - a TrainConfig (imported lazily)
    """``configs/collapse.yaml`` (``small``: with ``SMALL``'s sizes, no bars), on the zoo model it names."""
    from labs import zoo
    from minirl.training.train_config import TrainConfig

    sizes = dict(SMALL) if small else {}
    model = str(zoo.build(sizes.pop("model", "smollm2-135m")))
    # full size: each arm's step bar ("minirl train icepop_seed0 37/200") is an hours-long entry's sign of life
    return dataclasses.replace(TrainConfig.from_yaml(CONFIG), model=model, progress=not small, **sizes, **changes)


def train_arms(small: bool = False, out_dir: str | None = None) -> tuple[xr.Dataset, dict[str, xr.Dataset]]:
    """One run per (arm, seed), then ``read_arms`` of their folder.

    Each run lives in ``<out_dir>/<arm>_seed<s>`` (full size: the config's ``out_dir``, ``runs/collapse``)
    and is *resumed* from its checkpoint when one is there: the five runs take hours, so a killed
    entry continues where its last checkpoint (every 20 steps) left it, a finished run is read back
    (one final evaluation, no step retrained), and arms may be run one by one with ``mlab train
    --config configs/collapse.yaml --set correction=ARM --set seed=S --set out_dir=runs/collapse/ARM_seedS``
    (on other cores or machines) and collected here. ``small`` starts in a fresh temporary folder."""
    import minirl

    root = Path(out_dir or (tempfile.mkdtemp(prefix="collapse_lab_") if small else config().out_dir))
    for arm in ARMS:
        for seed in SEEDS[arm][:1] if small else SEEDS[arm]:
            run = root / f"{arm}_seed{seed}"
            cfg = config(small, correction=arm, seed=seed, out_dir=str(run))
            minirl.train(cfg, resume=(run / "checkpoint").is_dir())
    return read_arms(root)


def read_arms(root: str | Path) -> tuple[xr.Dataset, dict[str, xr.Dataset]]:
    """The runs under ``root`` as they stand, nothing trained -> (every per-step metric as [arm, seed,
    step] variables, NaN where a run has no value: a seed an arm did not run, the steps an unfinished
    run has not reached; each run's full log, monitor readings included, by ``<arm>_seed<s>``).

    Why apart from ``train_arms``: the entry takes hours, so its arms are often mid-way; this looks at
    them (``verdict``, ``figure``) without resuming any. The attributes say what ran (the first run's
    ``config.yaml``)."""
    from minirl.training import run_log
    from minirl.training.train_config import TrainConfig

    root = Path(root)
    runs = {(arm, seed): root / f"{arm}_seed{seed}" for arm in ARMS for seed in SEEDS[arm]
            if (root / f"{arm}_seed{seed}" / "metrics.nc").is_file()}
    if not runs:
        raise FileNotFoundError(f"no collapse run under {root} (looked for <arm>_seed<s>/metrics.nc, arms {ARMS}); "
                                "run `python -m labs.reproduce --only collapse` or one arm with `mlab train`")
    logs = {run.name: run_log.load(run / "metrics.nc") for run in runs.values()}
    curves = {key: _per_step(logs[run.name]) for key, run in runs.items()}
    seeds = sorted({s for _, s in curves})
    ds = xr.concat([xr.concat([curves.get((a, s), xr.Dataset()) for s in seeds], pd.Index(seeds, name="seed"),
                              join="outer") for a in ARMS], pd.Index(list(ARMS), name="arm"), join="outer")
    cfg = TrainConfig.from_yaml(next(iter(runs.values())) / "config.yaml")
    ds.attrs = {"model": Path(cfg.model).name, "engine": cfg.engine, "trainer_dtype": cfg.trainer_dtype,
                "task": cfg.task, "steps": cfg.steps, "out_dir": str(root)}  # one run directory each, for `mlab plot`
    return ds, logs


def _per_step(log: xr.Dataset) -> xr.Dataset:
    """A run log's per-step rows, by step (its monitor readings, on their own dims, stay in the log)."""
    return log[[v for v in log.data_vars if log[v].dims == ("row",)]].swap_dims(row="step")


def smooth_window(steps: int) -> int:
    """The verdict's and the figure's smoothing window: a twentieth of the run (10 steps at 200)."""
    return max(1, steps // 20)


def verdict(ds: xr.Dataset) -> pd.DataFrame:
    """``RULE`` per (arm, seed) that ran: the numbers it reads and ``collapsed``; ``steps_planned`` (the
    config's, ``ds.attrs["steps"]``) beside ``steps`` says which runs are unfinished (``read_arms``)."""
    from minirl.training.plot import smoothed

    rows = []
    for arm in ds["arm"].values:
        for seed in ds["seed"].values:
            run = ds.sel(arm=arm, seed=seed)
            reward = run["reward"].values
            if not np.isfinite(reward).any():
                continue  # this arm did not run this seed
            n = int(np.isfinite(reward).sum())
            reward = reward[:n]
            peak = float(np.nanmax(smoothed(reward, smooth_window(n))))
            last = float(np.nanmean(reward[-max(1, math.ceil(n / 10)):]))
            grad = run["grad_norm_max"].values[:n]
            grad = grad[np.isfinite(grad) & (grad > 0)]  # a no-signal step's 0 is not a measured norm
            median = float(np.median(grad)) if grad.size else math.nan
            spike = float(grad.max() / median) if grad.size else math.nan
            dprob = run["abs_dprob_max"].values[:n]
            rows.append({"arm": str(arm), "seed": int(seed), "steps": n,
                         "steps_planned": int(ds.attrs.get("steps", n)), "reward_peak_smoothed": peak,
                         "reward_last_tenth": last, "grad_norm_median": median, "grad_spike_x_median": spike,
                         "abs_dprob_max_first": float(dprob[0]), "abs_dprob_max_last": float(dprob[-1]),
                         "collapsed": bool((peak > 0 and last < 0.5 * peak) or spike > 10)})
    return pd.DataFrame(rows).set_index(["arm", "seed"])


def sentence(table: pd.DataFrame) -> str:
    """The verdict in words, every number from ``table``, whether Ring-1T's pattern showed, and which
    runs are unfinished (a verdict over 28 of 200 steps must say so)."""
    parts = []
    for arm, runs in table.groupby(level="arm", sort=False):
        k, n = int(runs["collapsed"].sum()), len(runs)
        short = runs["steps"] < runs["steps_planned"]
        unfinished = (f"; unfinished: {_span(runs['steps'], '.0f')} of {int(runs['steps_planned'].max())} steps"
                      if short.any() else "")
        parts.append(f"{arm}: collapsed in {k} of {n} seed{'s' if n > 1 else ''} (last tenth's reward "
                     f"{_span(runs['reward_last_tenth'])} vs smoothed peak {_span(runs['reward_peak_smoothed'])}; "
                     f"largest grad norm {_span(runs['grad_spike_x_median'], '.3g')}x its median; max |Δp| "
                     f"{_span(runs['abs_dprob_max_first'], '.3g')} -> {_span(runs['abs_dprob_max_last'], '.3g')}"
                     f"{unfinished})")
    arms = table["collapsed"].groupby(level="arm").mean()
    paper = arms.get("none", 0) > 0 and arms.get("icepop", 1) == 0 and arms.get("tis", 1) == 0
    if paper:
        head = "Ring-1T's pattern shows: the uncorrected arm collapses, TIS and IcePop do not"
    elif not arms.any():
        head = "No arm collapses (Ring-1T's uncorrected collapse does not show at this size)"
    else:
        head = "Arms collapse, but not as Ring-1T's pattern (uncorrected only)"
    so_far = "So far, with unfinished runs: " if (table["steps"] < table["steps_planned"]).any() else ""
    return f"{so_far}{head}. " + "; ".join(parts) + f". Rule: {RULE}."


def figure(ds: xr.Dataset) -> Figure:
    """Fig. 10-11's panels: reward, gradient norm (largest minibatch) and max |p_train - p_infer| per
    step, plus the share of tokens outside IcePop's band; each arm's mean over seeds, smoothed."""
    from minirl.training.plot import smoothed

    panels = {"reward": "training reward", "grad_norm_max": "gradient norm (largest minibatch)",
              "abs_dprob_max": "max |p_train - p_infer|", "icepop_band_out": "tokens outside [0.5, 5] (share)"}
    window = smooth_window(ds.sizes["step"])
    fig = Figure(figsize=(15, 3.4), layout="constrained")
    for ax, (var, title) in zip(fig.subplots(1, len(panels)), panels.items()):
        for arm in ds["arm"].values:
            curve = ds[var].sel(arm=arm).mean("seed", skipna=True).values
            ax.plot(ds["step"].values, smoothed(curve, window), color=COLORS[str(arm)], label=str(arm))
        ax.set(xlabel="RL step", title=title)
        ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{ds.attrs['model']}: {ds.attrs['trainer_dtype']} trainer vs {ds.attrs['engine']} rollouts, "
                 f"{ds.attrs['task']} (mean over seeds, trailing mean over {window} steps)")
    return fig


def _span(values: pd.Series, fmt: str = ".2f") -> str:
    """One run's value, or the range over seeds."""
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"
