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
    and is *resumed* from its checkpoint when one is there (or the ``.checkpoint.old`` a kill mid-save
    left): the five runs take hours, so a killed entry continues where its last checkpoint (every 20
    steps) left it. A finished run (``finished``) is read back as it is, nothing trained and no file of
    it rewritten, once its checkpoint's config is checked against this one (a changed model or seed is
    refused by name, as a resume would). Arms may be run one by one with ``mlab train --config
    configs/collapse.yaml --set correction=ARM --set seed=S --set out_dir=runs/collapse/ARM_seedS`` (on
    other cores or machines) and collected here. ``small`` starts in a fresh temporary folder."""
    import minirl
    from minirl.training import checkpointing

    root = Path(out_dir or (tempfile.mkdtemp(prefix="collapse_lab_") if small else config().out_dir))
    for arm in ARMS:
        for seed in SEEDS[arm][:1] if small else SEEDS[arm]:
            run = root / f"{arm}_seed{seed}"
            cfg = config(small, correction=arm, seed=seed, out_dir=str(run))
            if not finished(cfg):
                minirl.train(cfg, resume=checkpointing.exists(run / "checkpoint"))
    return read_arms(root)


def finished(cfg) -> bool:  # noqa: ANN001 - a TrainConfig
    """Whether the run in ``cfg.out_dir`` is done: its checkpoint is at ``cfg.steps`` and the run
    ended there (its manifest holds the stamps a run writes as it closes, which a kill -9 never
    writes; such a run is resumed to write its final rows and plot). A checkpoint whose config a
    resume would refuse raises, naming the change. Why not resume a finished run: that rewrote its
    log, config and plot (a finished arm read back was not left untouched; case CL12)."""
    import json

    from minirl.training import checkpointing, resume
    from minirl.training.run_dir import MANIFEST

    out = Path(cfg.out_dir)
    if not checkpointing.exists(out / "checkpoint") or not (out / "checkpoint").is_dir():
        return False
    resume.check_before_loading(cfg)  # a refused change (model, seed, ...) is named here, as a resume would
    if checkpointing.read_state(out / "checkpoint").get("step") != cfg.steps:
        return False
    try:
        return bool(json.loads((out / MANIFEST).read_text()).get("stamps"))
    except (OSError, ValueError, AttributeError):  # no manifest, or not one a run wrote: let the resume say
        return False


def read_arms(root: str | Path) -> tuple[xr.Dataset, dict[str, xr.Dataset]]:
    """The runs under ``root`` as they stand, nothing trained -> (every per-step metric as [arm, seed,
    step] variables, NaN where a run has no value: a seed an arm did not run, a run not started yet,
    the steps an unfinished run has not reached; each run's full log, monitor readings included, by
    ``<arm>_seed<s>``).

    Why apart from ``train_arms``: the entry takes hours, so its arms are often mid-way; this looks at
    them (``verdict``, ``figure``) without resuming any, whichever runs have not started (the third arm
    stays unstarted for hours at full size). The attributes say what ran (the first run's ``config.yaml``)
    and, in ``missing``, the runs of ``SEEDS`` not started among the seeds some arm ran (the small entry
    runs seed 0 only), comma-separated."""
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
    ds = xr.merge([c.expand_dims(arm=[a], seed=[s]) for (a, s), c in curves.items()],
                  join="outer", compat="no_conflicts").reindex(arm=list(ARMS), seed=seeds)
    cfg = TrainConfig.from_yaml(next(iter(runs.values())) / "config.yaml")
    missing = [f"{a}_seed{s}" for a in ARMS for s in SEEDS[a] if s in seeds and (a, s) not in runs]
    ds.attrs = {"model": Path(cfg.model).name, "engine": cfg.engine, "trainer_dtype": cfg.trainer_dtype,
                "task": cfg.task, "steps": cfg.steps, "out_dir": str(root),  # one run directory each, for `mlab plot`
                "missing": ", ".join(missing)}
    return ds, logs


def _per_step(log: xr.Dataset) -> xr.Dataset:
    """A run log's per-step rows, by step (its monitor readings, on their own dims, stay in the log)."""
    return log[[v for v in log.data_vars if log[v].dims == ("row",)]].swap_dims(row="step")


def smooth_window(steps: int) -> int:
    """The verdict's and the figure's smoothing window: a twentieth of the run (10 steps at 200)."""
    return max(1, steps // 20)


def verdict(ds: xr.Dataset) -> pd.DataFrame:
    """``RULE`` per (arm, seed) that ran: the numbers it reads and ``collapsed``; ``steps_planned`` (the
    config's, ``ds.attrs["steps"]``) beside ``steps`` says which runs are unfinished, and ``attrs["missing"]``
    which have not started (``read_arms``): a run with no step has no numbers to put in a row."""
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
                         "reward_collapsed": bool(peak > 0 and last < 0.5 * peak), "grad_spike": bool(spike > 10)})
            rows[-1]["collapsed"] = rows[-1]["reward_collapsed"] or rows[-1]["grad_spike"]
    table = pd.DataFrame(rows).set_index(["arm", "seed"])
    table.attrs["missing"] = [r for r in ds.attrs.get("missing", "").split(", ") if r]
    return table


def sentence(table: pd.DataFrame) -> str:
    """The verdict in words, every number from ``table``: which runs' reward collapsed, apart from which
    the rule flags by a gradient spike alone (one spike while the reward holds is not Ring-1T's collapse),
    whether Ring-1T's pattern showed by reward, and which runs are unfinished or not started (a verdict
    over 28 of 200 steps, or over two arms of three, must say so)."""
    parts = [_arm_clause(str(arm), runs) for arm, runs in table.groupby(level="arm", sort=False)]
    missing = table.attrs.get("missing", [])
    if missing:
        parts.append(f"not started: {', '.join(missing)}")
    so_far = ("So far, with unfinished runs: " if missing or (table["steps"] < table["steps_planned"]).any()
              else "")
    return f"{so_far}{headline(table)} " + "; ".join(parts) + f". Rule: {RULE}."


def headline(table: pd.DataFrame) -> str:
    """The verdict's first sentences alone (a notebook's Summary): reward collapses, then spikes apart."""
    return _head(table) + _spikes(table)


def _head(table: pd.DataFrame) -> str:
    """Ring-1T's pattern judged by reward: the uncorrected arm's reward collapses, TIS's and IcePop's do not."""
    fell = table["reward_collapsed"].groupby(level="arm").any()
    if fell.get("none", False) and not fell.get("tis", False) and not fell.get("icepop", False):
        return f"By reward, Ring-1T's pattern shows: {_runs(table)} collapses, no corrected run does."
    if not fell.any():
        return "By reward, no run collapses (Ring-1T's uncorrected collapse does not show at this size)."
    return f"By reward, runs collapse, but not as Ring-1T's pattern (uncorrected only): {_runs(table)}."


def _spikes(table: pd.DataFrame) -> str:
    """The runs the rule flags by a gradient spike although their reward held, with the spike and the reward."""
    only = table[table["grad_spike"] & ~table["reward_collapsed"]]
    if only.empty:
        return ""
    runs = ", ".join(f"{arm} seed {seed} (grad norm {r['grad_spike_x_median']:.3g}x its median; reward held at "
                     f"{r['reward_last_tenth']:.2f} in the last tenth)" for (arm, seed), r in only.iterrows())
    return f" The rule also flags, by a gradient spike alone, {runs}: a spike, not a collapse of the reward."


def _runs(table: pd.DataFrame) -> str:
    """"none seed 1 (reward 0.30 in the last tenth vs a smoothed peak 0.71)" for each run whose reward collapsed."""
    fell = table[table["reward_collapsed"]]
    return ", ".join(f"{arm} seed {seed} (reward {r['reward_last_tenth']:.2f} in the last tenth vs a smoothed peak "
                     f"{r['reward_peak_smoothed']:.2f})" for (arm, seed), r in fell.iterrows())


def _arm_clause(arm: str, runs: pd.DataFrame) -> str:
    """One arm's numbers: reward collapses and gradient spikes counted apart, then the ranges over seeds."""
    n = len(runs)
    short = runs["steps"] < runs["steps_planned"]
    unfinished = (f"; unfinished: {_span(runs['steps'], '.0f')} of {int(runs['steps_planned'].max())} steps"
                  if short.any() else "")
    return (f"{arm}: reward collapsed in {int(runs['reward_collapsed'].sum())} of {n} seed{'s' if n > 1 else ''}, "
            f"gradient spike in {int(runs['grad_spike'].sum())} (last tenth's reward "
            f"{_span(runs['reward_last_tenth'])} vs smoothed peak {_span(runs['reward_peak_smoothed'])}; largest grad "
            f"norm {_span(runs['grad_spike_x_median'], '.3g')}x its median; max |Δp| "
            f"{_span(runs['abs_dprob_max_first'], '.3g')} -> {_span(runs['abs_dprob_max_last'], '.3g')}{unfinished})")


VIEW = {"steps": "steps", "reward_last_tenth": "reward last 10th", "reward_peak_smoothed": "reward peak",
        "grad_spike_x_median": "grad spike (x median)", "reward_collapsed": "reward collapsed",
        "grad_spike": "grad spike > 10x"}
"""``view``'s columns, renamed to say what each is in a few words."""


def view(table: pd.DataFrame) -> pd.DataFrame:
    """The verdict's columns a reader judges by, narrow enough for a notebook's width (the full ``table``
    has eleven columns and scrolled its ``collapsed`` column off-screen)."""
    return table[list(VIEW)].rename(columns=VIEW).round(2)


def figure(ds: xr.Dataset) -> Figure:
    """Fig. 10-11's panels: reward, gradient norm (largest minibatch) and max |p_train - p_infer| per
    step, plus the share of tokens outside IcePop's band; one line per run (a mean over seeds hid the one
    collapse as a mild dip), smoothed, a run whose reward collapsed drawn thick and named so, a gradient
    spike the rule flags circled on its panel."""
    from minirl.training.plot import smoothed

    panels = {"reward": "training reward", "grad_norm_max": "gradient norm (largest minibatch)",
              "abs_dprob_max": "max |p_train - p_infer|", "icepop_band_out": "tokens outside [0.5, 5] (share)"}
    window = smooth_window(ds.sizes["step"])
    table = verdict(ds)
    fig = Figure(figsize=(15, 3.6), layout="constrained")
    axes = dict(zip(panels, fig.subplots(1, len(panels))))
    for (arm, seed), r in table.iterrows():
        run = ds.sel(arm=arm, seed=seed)
        style = dict(color=COLORS[arm], ls=("-", "--", ":")[seed % 3], lw=2.6 if r["reward_collapsed"] else 1.0,
                     label=f"{arm} seed {seed}" + (": reward collapsed" if r["reward_collapsed"] else ""))
        for var, ax in axes.items():
            if var in ds:
                ax.plot(ds["step"].values, smoothed(run[var].values, window), **style)
        if r["grad_spike"]:
            at = int(np.nanargmax(run["grad_norm_max"].values))
            x, y = ds["step"].values[at], run["grad_norm_max"].values[at]
            axes["grad_norm_max"].plot(x, y, "o", mfc="none", ms=12, color=COLORS[arm])
            axes["grad_norm_max"].annotate(f"{arm} seed {seed}: {r['grad_spike_x_median']:.0f}x its median, unsmoothed",
                                           (x, y), xytext=(-8, -4), textcoords="offset points", ha="right",
                                           va="top", fontsize=7, color=COLORS[arm])
    for var, ax in axes.items():
        ax.set(xlabel="RL step", title=panels[var])
        ax.grid(alpha=0.3)
    axes["reward"].legend(fontsize=7)
    fig.suptitle(f"{ds.attrs['model']}: {ds.attrs['trainer_dtype']} trainer vs {ds.attrs['engine']} rollouts, "
                 f"{ds.attrs['task']} (each run, trailing mean over {window} steps)")
    return fig


def _span(values: pd.Series, fmt: str = ".2f") -> str:
    """One run's value, or the range over seeds."""
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"
