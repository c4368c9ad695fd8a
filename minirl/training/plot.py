"""See runs: overlay the curves of one or more run directories in one figure.

    mlab plot runs/grpo runs/tis runs/icepop --out fig.png

or from Python, ``minirl.training.plot.plot_runs(["runs/grpo", "runs/icepop"], "fig.png")``. The seeds'
figures are overlays of runs (GRPO vs TIS vs IcePop, C3PO++ vs baseline), so the legend names
each run by what differs in its config (``config.yaml`` beside ``metrics.nc``): only the keys
whose values differ between the runs, never the ones they share. Every ``minirl.train`` run
writes its own ``curves.png`` with this function at the end.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # matplotlib and xarray load on first use: `mlab --help` stays fast
    import xarray as xr

#: (title, y-axis label, how to get the curve from a run log) per panel.
PANELS = [
    ("training reward", "mean reward per sample", lambda ds: _column(ds, "reward")),
    ("held-out accuracy", "greedy accuracy (fraction)", lambda ds: _column(ds, "eval_accuracy")),
    ("train-inference gap", "mean |Δ logprob| (nats/token)", lambda ds: _column(ds, "abs_dlogp_mean")),
    ("tokens masked by the correction", "masked (‰ of tokens)", lambda ds: _column(ds, "frac_masked") * 1000),
    ("gradient norm", "L2 norm before clipping", lambda ds: _column(ds, "grad_norm")),
    ("step time", "seconds per step (all phases)", lambda ds: _step_time(ds)),
]

IGNORED_KEYS = ("out_dir", "progress", "report_to")
"""config keys that never name a run in the legend (where it ran, how it reported)."""


def plot_runs(run_dirs: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Write one figure (format from ``out``'s suffix, e.g. .png) overlaying ``run_dirs``' curves
    in ``PANELS``; returns ``out``. Raises ``ValueError`` naming a directory that holds no run."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from minirl.training.run_log import load

    if not run_dirs:
        raise ValueError("no run directory given: pass one or more out_dir paths of minirl runs")
    logs = []
    for d in map(Path, run_dirs):
        if not (d / "metrics.nc").is_file():
            raise ValueError(f"{d}: no metrics.nc, so not a minirl run directory (a run's out_dir holds "
                             f"metrics.nc and config.yaml); pass the out_dir of a run")
        logs.append(load(d / "metrics.nc"))
    labels = legend_labels(run_dirs)
    fig = Figure(figsize=(13, 6.5))
    axes = fig.subplots(2, 3).ravel()
    for ax, (title, ylabel, curve) in zip(axes, PANELS):
        drawn = False
        for ds, label in zip(logs, labels):
            y = curve(ds)
            ok = np.isfinite(y)
            if ok.any():
                ax.plot(ds["step"].values[ok], y[ok], marker=".", label=label)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not measured in these runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(len(names), 4), fontsize="small")
    fig.tight_layout(rect=(0, 0.06 if handles else 0, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def legend_labels(run_dirs: list[str | os.PathLike]) -> list[str]:
    """One label per run: ``key=value`` for each config key that differs between the runs (from
    each run's ``config.yaml``); the directory name where that says nothing (one run, identical
    configs, or a run without config.yaml) or would not tell two runs apart."""
    import yaml

    configs = []
    for d in map(Path, run_dirs):
        f = d / "config.yaml"
        configs.append(yaml.safe_load(f.read_text()) if f.is_file() else {})
    keys = sorted({k for c in configs for k in c} - set(IGNORED_KEYS))
    differ = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1] if len(configs) > 1 else []
    labels = [", ".join(f"{k}={_short(c.get(k))}" for k in differ) or Path(d).name
              for c, d in zip(configs, run_dirs)]
    if len(set(labels)) < len(labels):
        labels = [f"{Path(d).name}: {label}" if label != Path(d).name else label for d, label in zip(run_dirs, labels)]
    return labels


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plot", help="overlay the curves of minirl runs in one figure",
                              description="Reward, held-out accuracy, |Δ logprob|, masked ‰, grad norm and step "
                                          "time of each run, overlaid; the legend names each run by the config "
                                          "keys that differ between them.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="out_dir of a minirl run (holds metrics.nc)")
    p.add_argument("--out", required=True, metavar="FIG", help="figure to write (.png, .pdf, .svg)")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    print(plot_runs(args.runs, args.out))
    return 0


def _column(ds: xr.Dataset, name: str) -> np.ndarray:
    return ds[name].values.astype(np.float64) if name in ds else np.full(ds.sizes["row"], math.nan)


def _step_time(ds: xr.Dataset) -> np.ndarray:
    names = [n for n in ds.data_vars if str(n).startswith("time_")]
    if not names:
        return np.full(ds.sizes["row"], math.nan)
    return np.nansum(np.stack([ds[n].values for n in names]), axis=0)


def _short(value: object) -> str:
    """A config value short enough for a legend (a model path by its last part)."""
    text = str(value)
    return Path(text).name if os.sep in text and len(text) > 24 else text
