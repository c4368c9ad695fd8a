"""See runs: overlay the curves of one or more run directories in one figure.

    mlab plot runs/grpo runs/tis runs/icepop --out fig.png

or from Python, ``minirl.training.plot.plot_runs(["runs/grpo", "runs/icepop"], "fig.png")``.
``mlab plot RUN --sites --out fig.png`` draws one run's mismatch monitor instead (``plot_sites``:
a site x step heatmap of relative error and the routing flips per layer, titled by the computed
sentence, ``minirl.training.monitor_report``). The seeds'
figures are overlays of runs (GRPO vs TIS vs IcePop, C3PO++ vs baseline), so the legend names
each run by what differs in its config (``config.yaml`` beside ``metrics.nc``): only the keys
whose values differ between the runs, never the ones they share. Runs whose configs differ only
in ``seed`` are one curve: their mean per step with the 95 % t-interval over seeds shaded, since one
seed's curve can go either way. Every ``minirl.train`` run writes its own ``curves.png`` with this
function at the end.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from minirl.output_paths import check_output_file, temp_sibling
from minirl.training.student_t import t_quantile

if TYPE_CHECKING:  # matplotlib and xarray load on first use: `mlab --help` stays fast
    import xarray as xr
    from matplotlib.figure import Figure

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


def plot_runs(run_dirs: list[str | os.PathLike], out: str | os.PathLike, smooth: int = 1) -> Path:
    """Write ``figure(run_dirs, smooth)`` to ``out`` (format from its suffix: .png, .pdf, .svg); returns
    ``out``. Raises ``ValueError`` naming a directory that holds no run log, ``OSError`` for an
    ``out`` that cannot take a figure (checked before any log loads)."""
    out = _check_out(Path(out))
    return _save(figure(run_dirs, smooth), out)


def plot_sites(run_dir: str | os.PathLike, out: str | os.PathLike, readings: xr.Dataset | None = None) -> Path:
    """Write the mismatch monitor's figure of one run (``monitor_report.figure``) to ``out``;
    a run without monitor readings is refused by name. ``readings``: the run's log, where the
    caller has it loaded already (the run itself, at its end)."""
    from minirl.training import monitor_report

    out = _check_out(Path(out))
    if readings is None:
        _load(Path(run_dir))  # says what the directory holds when it is no run
        readings = monitor_report.load(Path(run_dir) / "metrics.nc")
    return _save(monitor_report.figure(readings), out, tight=False)  # its layout engine fits it


def figure(run_dirs: list[str | os.PathLike], smooth: int = 1) -> Figure:
    """``run_dirs``' curves overlaid in ``PANELS``, the seeds of one config as one band, the legend
    beside the panels in as many distinct colours as there are curves; each run's curve is first
    ``smoothed`` over ``smooth`` steps (1 = raw)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not run_dirs:
        raise ValueError("no run directory given: pass one or more out_dir paths of minirl runs")
    logs = [_load(Path(d)) for d in run_dirs]
    groups = seed_groups(run_dirs)
    colours = _colours(len(groups))
    fig = Figure(figsize=(13, 6.5))
    axes = fig.subplots(2, 3).ravel()
    for ax, (title, ylabel, curve) in zip(axes, PANELS):
        drawn = False
        for (label, members), colour in zip(groups, colours):
            steps, mean, ci = band([(logs[i]["step"].values, smoothed(curve(logs[i]), smooth)) for i in members])
            if steps.size:
                ax.plot(steps, mean, marker=".", color=colour, label=label)
                if len(members) > 1:
                    ax.fill_between(steps, ci[0], ci[1], color=colour, alpha=0.2, linewidth=0)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not measured in these runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    handles, names = axes[0].get_legend_handles_labels()
    if handles:  # beside the panels, never over them; the saved figure grows to hold it (bbox_inches)
        fig.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), ncol=math.ceil(len(names) / 30),
                   fontsize="small" if len(names) <= 10 else "x-small")
    return fig


def smoothed(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` steps of the finite values (a step's value and the
    ``window - 1`` before it; NaN where none is finite, so sparse columns such as held-out accuracy
    stay sparse in effect): at 600 steps, three raw arms are one unreadable band."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"smooth={window!r}: the smoothing window is a whole number of steps >= 1 (1 = raw curves)")
    values = np.asarray(values, dtype=float)
    if window == 1:
        return values
    finite = np.isfinite(values)
    sums = np.convolve(np.where(finite, values, 0.0), np.ones(window))[: values.size]
    counts = np.convolve(finite.astype(float), np.ones(window))[: values.size]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def seed_groups(run_dirs: list[str | os.PathLike]) -> list[tuple[str, list[int]]]:
    """``(legend label, indices of run_dirs)`` per curve: runs whose ``config.yaml`` differ only in
    ``seed`` (and the ``IGNORED_KEYS``) are one curve. A label is ``key=value`` for each config key
    that differs between the curves; the directory name where that says nothing (one curve, or a
    run without config.yaml) or would not tell two curves apart; ``(N seeds)`` follows a band
    (``_band_size``)."""
    from minirl.training.config_file import read_config_file  # bounded, no aliases: a config cannot hang the plot

    dirs = [Path(d) for d in run_dirs]
    configs = [read_config_file(d / "config.yaml") if (d / "config.yaml").is_file() else None for d in dirs]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        key = repr(sorted((k, repr(v)) for k, v in c.items() if k not in (*IGNORED_KEYS, "seed"))) if c else str(i)
        groups.setdefault(key, []).append(i)
    heads = [configs[m[0]] or {} for m in groups.values()]
    keys = sorted({k for c in heads for k in c} - {*IGNORED_KEYS, "seed"})
    differ = [k for k in keys if len({repr(c.get(k)) for c in heads}) > 1] if len(heads) > 1 else []
    labels = [", ".join(f"{k}={_short(c.get(k))}" for k in differ) or dirs[m[0]].name
              for c, m in zip(heads, groups.values())]
    if len(set(labels)) < len(labels):
        labels = [f"{dirs[m[0]].name}: {label}" if label != dirs[m[0]].name else label
                  for label, m in zip(labels, groups.values())]
    return [(label + _band_size([configs[i] for i in m]), m) for label, m in zip(labels, groups.values())]


def _band_size(configs: list[dict | None]) -> str:
    """`` (N seeds)`` after a band of N seeds, `` (N runs)`` where its runs share a seed (copies of one
    run: the band is not a spread over seeds), `` (N runs, K seeds)`` between; '' for one run."""
    if len(configs) == 1:
        return ""
    seeds = len({repr((c or {}).get("seed")) for c in configs})
    if seeds == len(configs):
        return f" ({seeds} seeds)"
    return f" ({len(configs)} runs)" if seeds == 1 else f" ({len(configs)} runs, {seeds} seeds)"


def legend_labels(run_dirs: list[str | os.PathLike]) -> list[str]:
    """One legend label per run (``seed_groups``': runs of one band share theirs)."""
    by_run = {i: label for label, members in seed_groups(run_dirs) for i in members}
    return [by_run[i] for i in range(len(run_dirs))]


def band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, values)`` of one curve per seed -> ``(steps, mean, [low, high])`` over the steps some
    seed measured: the mean of the seeds' finite values and its 95 % t-interval (the mean itself
    where fewer than two seeds have a value)."""
    steps = np.unique(np.concatenate([s[np.isfinite(y)] for s, y in curves]))
    table = np.full((len(curves), steps.size), np.nan)
    for row, (s, y) in zip(table, curves):
        ok = np.isfinite(y)
        row[np.searchsorted(steps, s[ok])] = y[ok]
    stats = [mean_ci(column) for column in table.T]
    mean = np.array([m for m, _ in stats])
    ci = np.array([ci if ci is not None else [m, m] for m, ci in stats]).reshape(-1, 2).T
    return steps, mean, ci


def mean_ci(values: np.ndarray) -> tuple[float, list[float] | None]:
    """Mean of the finite ``values`` (one per seed) and its 95 % t-interval, None under two values:
    a handful of seeds is far from the normal approximation, so Student t with n - 1 degrees of freedom."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    mean = float(x.mean())
    if len(x) < 2:
        return mean, None
    half = t_quantile(0.975, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, [mean - half, mean + half]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plot", help="overlay the curves of minirl runs in one figure",
                              description="Reward, held-out accuracy, |Δ logprob|, masked ‰, grad norm and step "
                                          "time of each run, overlaid; the legend names each run by the config "
                                          "keys that differ between them, and runs that differ only in seed are "
                                          "one band (mean, 95% interval).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="out_dir of a minirl run (holds metrics.nc)")
    p.add_argument("--out", required=True, metavar="FIG", help="figure file to write (.png, .pdf, .svg)")
    p.add_argument("--smooth", type=int, default=1, metavar="N",
                   help="trailing mean of each run's curves over N steps (default 1: raw)")
    p.add_argument("--sites", action="store_true",
                   help="one run's mismatch monitor (monitor_every): site x step heatmap of relative error and "
                        "routing flips per layer, and the sentence that sums them up")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    if not args.sites:
        print(plot_runs(args.runs, args.out, args.smooth))
        return 0
    from minirl.training import monitor_report

    if len(args.runs) != 1:
        raise ValueError(f"--sites draws one run's monitor; got {len(args.runs)} runs: pass one RUN_DIR")
    print(plot_sites(args.runs[0], args.out))
    print(monitor_report.sentence(monitor_report.load(Path(args.runs[0]) / "metrics.nc")))
    return 0


def _check_out(out: Path) -> Path:
    """Refused before any log loads: a name without a figure format (matplotlib would add .png and
    write a file nobody named), and what ``check_output_file`` refuses (a directory, a device, a
    capture or run log)."""
    from matplotlib.figure import Figure

    if out.is_dir():  # said first: a directory's missing suffix is not the problem
        check_output_file(out, "figure")
    formats = Figure().canvas.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise ValueError(f"--out {out}: the figure's format comes from its suffix; end the name in .png, .pdf or "
                         f".svg (or {', '.join('.' + f for f in sorted(formats) if f not in ('png', 'pdf', 'svg'))})")
    return check_output_file(out, "figure")


def _save(fig: Figure, out: Path, tight: bool = True) -> Path:
    """Through a temporary sibling and a rename (``minirl.output_paths``): a crash leaves no half
    figure. ``tight``: grow the saved area to what is drawn outside the axes (the legend beside the
    panels); a figure whose layout engine already fits it saves once, without that extra draw."""
    fd, tmp = temp_sibling(out, "figure")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=out.suffix[1:].lower(), dpi=100, bbox_inches="tight" if tight else None)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _load(d: Path) -> xr.Dataset:
    """A run's log, or a ``ValueError`` saying what the directory holds instead."""
    from minirl.training.run_log import load

    path = d / "metrics.nc"
    if not path.is_file():
        raise ValueError(f"{d}: no metrics.nc, so not a minirl run directory (a run's out_dir holds "
                         f"metrics.nc and config.yaml); pass the out_dir of a run")
    try:
        ds = load(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable netCDF run log ({' '.join(str(e).split())[:200]})") from None
    if "row" not in ds.dims or "step" not in ds.coords:
        kind = (" it is an aligntools capture (mlab capture writes those; mlab diff / mlab analyze read them)"
                if "token" in ds.dims else f" its dims are {dict(ds.sizes)}")
        raise ValueError(f"{path} is not a minirl run log (one row per RL step, coordinate step):{kind}")
    return ds


def _colours(n: int) -> list:
    """``n`` distinct colours: tab10 / tab20 while they last, then evenly spaced along turbo."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["turbo"](x) for x in np.linspace(0.03, 0.97, n)]


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
