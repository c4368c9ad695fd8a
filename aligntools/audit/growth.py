"""Why the mismatch grows over a run: per-step views of the engine-trainer gap, and its growth split
into a change of *which tokens* are sampled (length, low-probability tokens, entropy, staleness) and a
change of the gap *at fixed tokens*.

Why: a run's mean |engine - trainer logprob| can climb (vime #64: 0.011 -> 0.036 over 30 steps)
without any engine getting worse: the policy samples longer completions, more low-probability or
high-entropy tokens, or staler ones, and those carry a larger gap. Reweighting tells the two apart.
Each token falls in one bin per factor (``bins``); with w_s(c) the share of step s's tokens in cell
c (a combination of bins) and g_s(c) their mean gap,

    G_s - G_0 = sum_c (w_s(c) - w_0(c)) g_0(c)   [mix: the first step's gaps, step s's token mix]
              + sum_c w_s(c) (g_s(c) - g_0(c))   [within: step s's mix, the gaps moved]

exactly (a cell empty at the first step takes g_s(c): a new kind of token is a change of mix). The
mix term over the cells of a set S of factors is v(S); each factor's contribution is its Shapley value
over v, so the four contributions and ``within`` sum to the growth, whatever the factors' correlation
(long completions hold more low-probability tokens). docs/audit.md, "Growth over a run".

The per-token gap is scored here (an fp32 forward per record, log-softmax in float64, as the audit
scores it): ``AuditResult`` carries the verdict and causes, not per-token values.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import xarray as xr
from torch import nn

from aligntools.audit.score import load_model
from aligntools.records import Record, RecordError, read

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Model = str | os.PathLike | nn.Module
FACTORS = ("length", "low_prob", "entropy", "staleness")
LOW_PROB = (0.01, 0.1)
"""Edges of the trainer-probability bins: below 1 %, 1-10 %, the rest (a bf16 gap sits on the first)."""
N_BINS = 3
"""Bins per factor at most (``bins``)."""
CHUNK_ROWS = 256
"""Rows of [rows, V] float64 at once: bounds the temporaries on a real vocabulary."""


def growth(records: Sequence[Record] | str | os.PathLike | Sequence[str | os.PathLike],
           model: Model | Mapping[int | str, Model], staleness: Sequence[int] | None = None) -> xr.Dataset:
    """The gap's per-step views and its growth from the first step, decomposed.

    ``records``: Records (grouped by their ``step``), a file, or one file per step in order (slime,
    verl dumps: a record without ``step`` takes its file's index). ``model``: the trainer checkpoint,
    or ``{step: checkpoint}`` where the weights moved between steps (each step scored with the weights
    that sampled it; one model for every step measures their drift as gap). ``staleness``: per
    record, how many updates its policy lagged the trainer (async runs; records do not carry it), 0 if None.
    """
    recs = _records(records)
    lag = [0] * len(recs) if staleness is None else [int(x) for x in staleness]
    if len(lag) != len(recs):
        raise RecordError(f"growth: {len(lag)} staleness values for {len(recs)} records; give one per record")
    return decompose(per_token(recs, model, lag))


def per_token(records: Sequence[Record], model: Model | Mapping[int | str, Model], staleness: Sequence[int]
              ) -> xr.Dataset:
    """One row per recorded token (dim ``token``): ``step``, ``gap`` = |engine - trainer logprob|,
    trainer ``prob`` and ``entropy`` (nats) at its position, ``position`` in the completion, the
    completion's ``length``, the record's ``staleness``."""
    steps = _steps(records)
    cols: dict[str, list] = {k: [] for k in ("step", "gap", "prob", "entropy", "position", "length", "staleness")}
    loaded: dict[int, nn.Module] = {}
    for s in steps:
        idx = [i for i, r in enumerate(records) if r.step == s]
        m = model[s] if isinstance(model, Mapping) else model
        trainer = loaded.setdefault(id(m), load_model(m))
        lp, ent = (np.concatenate(x) for x in zip(*(_logprob_entropy(trainer, records[i]) for i in idx)))  # [n]
        engine = np.array([x for i in idx for x in records[i].logprobs])
        cols["step"] += [s] * len(lp)
        cols["gap"] += np.abs(engine - lp).tolist()
        cols["prob"] += np.exp(lp).tolist()
        cols["entropy"] += ent.tolist()
        cols["position"] += [t for i in idx for t in range(len(records[i].completion_ids))]
        cols["length"] += [len(records[i].completion_ids) for i in idx for _ in records[i].completion_ids]
        cols["staleness"] += [staleness[i] for i in idx for _ in records[i].completion_ids]
    return xr.Dataset({k: ("token", np.asarray(v)) for k, v in cols.items()}, attrs={"steps": list(steps)})


def bins(tokens: xr.Dataset) -> dict[str, np.ndarray]:
    """Each token's bin per factor (0, 1, 2), edges shared by every step: ``length`` (position in the
    completion, split at the run's median position), ``low_prob`` (trainer probability < 1 %, 1-10 %,
    >= 10 %), ``entropy`` (split at the run's median), ``staleness`` (0, 1, >= 2 updates)."""
    pos, ent = tokens["position"].values, tokens["entropy"].values
    return {"length": (pos >= np.median(pos)).astype(int) if np.ptp(pos) else np.zeros_like(pos),
            "low_prob": np.searchsorted(LOW_PROB, tokens["prob"].values, side="right"),
            "entropy": (ent >= np.median(ent)).astype(int) if np.ptp(ent) else np.zeros(len(ent), int),
            "staleness": tokens["staleness"].values.clip(0, 2).astype(int)}


def decompose(tokens: xr.Dataset) -> xr.Dataset:
    """``per_token``'s table -> per step: ``gap`` (and its standard error ``gap_se``), ``tokens``,
    ``growth`` (gap - the first step's), ``contribution`` [step, term] (the factors' Shapley shares of
    the mix, then ``within``; they sum to ``growth``), ``mix`` and ``bin_gap`` [step, factor, bin], and
    ``gap_by_position`` [step, position] (the token x step view)."""
    steps = list(tokens.attrs["steps"])
    step, gap, b = tokens["step"].values, tokens["gap"].values, bins(tokens)
    at = [step == s for s in steps]  # [steps] of [tokens] bool
    per_step = np.array([gap[now].mean() for now in at])
    mix = np.array([[[(b[f][now] == c).mean() for c in range(N_BINS)] for f in FACTORS] for now in at])
    bin_gap = np.array([[[_mean(gap[now & (b[f] == c)]) for c in range(N_BINS)] for f in FACTORS] for now in at])
    positions = np.arange(int(tokens["position"].max()) + 1)
    by_pos = np.array([[_mean(gap[now & (tokens["position"].values == p)]) for p in positions] for now in at])
    coords = {"step": steps, "term": [*FACTORS, "within"], "factor": list(FACTORS), "bin": list(range(N_BINS)),
              "position": positions}
    return xr.Dataset({
        "gap": ("step", per_step, {"units": "nats", "long_name": "mean |engine - trainer logprob|"}),
        "gap_se": ("step", np.array([gap[now].std(ddof=1) / math.sqrt(now.sum()) for now in at]),
                   {"units": "nats", "long_name": "standard error of the mean gap"}),
        "tokens": ("step", np.array([now.sum() for now in at])),
        "growth": ("step", per_step - per_step[0], {"units": "nats"}),
        "contribution": (("step", "term"), np.array([_contributions(b, gap, at[0], now) for now in at]),
                         {"units": "nats"}),
        "mix": (("step", "factor", "bin"), mix),
        "bin_gap": (("step", "factor", "bin"), bin_gap, {"units": "nats"}),
        "gap_by_position": (("step", "position"), by_pos, {"units": "nats"}),
        "mean_length": ("step", np.array([tokens["length"].values[now].mean() for now in at])),
        "low_prob_share": ("step", np.array([(tokens["prob"].values[now] < LOW_PROB[1]).mean() for now in at])),
        "mean_entropy": ("step", np.array([tokens["entropy"].values[now].mean() for now in at])),
        "mean_staleness": ("step", np.array([tokens["staleness"].values[now].mean() for now in at])),
    }, coords=coords, attrs={"bins": "length: position >= the run's median; low_prob: p < 0.01, < 0.1, >= 0.1 "
                                      "(bins 0, 1, 2); entropy: >= the run's median; staleness: 0, 1, >= 2"})


def _contributions(b: dict[str, np.ndarray], gap: np.ndarray, first: np.ndarray, now: np.ndarray) -> list[float]:
    """[factors..., within] for one step: the Shapley value of each factor in the mix game, then the rest."""
    v = {subset: _mix(b, subset, gap, first, now) for n in range(len(FACTORS) + 1)
         for subset in itertools.combinations(FACTORS, n)}
    return [*(_shapley(v, f) for f in FACTORS), gap[now].mean() - gap[first].mean() - v[FACTORS]]


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else math.nan


def _mix(b: dict[str, np.ndarray], subset: tuple[str, ...], gap: np.ndarray, first: np.ndarray, now: np.ndarray
         ) -> float:
    """v(S) = sum over the cells of the factors in ``subset`` of (w_s - w_0) * g_0 (g_s where w_0 = 0)."""
    if not subset:
        return 0.0
    cell = np.zeros(len(gap), dtype=np.int64)
    for f in subset:
        cell = cell * N_BINS + b[f]
    total = 0.0
    for c in np.unique(cell[first | now]):
        at0, ats = first & (cell == c), now & (cell == c)
        g0 = gap[at0].mean() if at0.any() else gap[ats].mean()
        total += (ats.sum() / now.sum() - at0.sum() / first.sum()) * g0
    return float(total)


def _shapley(v: dict[tuple[str, ...], float], factor: str) -> float:
    """Factor's Shapley value of the mix game ``v`` (subsets as tuples in ``FACTORS`` order)."""
    others = [f for f in FACTORS if f != factor]
    n, phi = len(FACTORS), 0.0
    for k in range(n):
        for subset in itertools.combinations(others, k):
            with_f = tuple(f for f in FACTORS if f in subset or f == factor)
            phi += math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) * (v[with_f] - v[subset])
    return phi


def _logprob_entropy(model: nn.Module, record: Record) -> tuple[np.ndarray, np.ndarray]:
    """The trainer's fp32 forward over one record (batch 1: the exact recorded prefix, as the audit
    scores it), log-softmax in float64: (logprob of each completion token [C], entropy [C])."""
    ids = torch.tensor([[*record.prompt_ids, *record.completion_ids[:-1]]])  # [1, S]
    tokens = torch.tensor(record.completion_ids)
    lp, ent = [], []
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=len(tokens)).logits[0]  # [C, V]
        for i in range(0, len(tokens), CHUNK_ROWS):
            logp = torch.log_softmax(logits[i:i + CHUNK_ROWS].double(), -1)  # [rows, V]
            lp.append(logp.gather(-1, tokens[i:i + CHUNK_ROWS, None])[:, 0])
            ent.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(lp).numpy(), torch.cat(ent).numpy()


def _records(records: Sequence[Record] | str | os.PathLike | Sequence[str | os.PathLike]) -> list[Record]:
    if isinstance(records, (str, os.PathLike)):
        return read(records)
    items = list(records)
    if items and all(isinstance(r, (str, os.PathLike)) for r in items):  # one file per step
        return [r if r.step is not None else _with_step(r, k) for k, p in enumerate(items) for r in read(Path(p))]
    if not items or not all(isinstance(r, Record) for r in items):
        raise RecordError("growth: give records files or a non-empty list of aligntools.records.Record")
    return items


def _with_step(record: Record, step: int) -> Record:
    return dataclasses.replace(record, step=step)


def _steps(records: Sequence[Record]) -> list[int | str]:
    """The records' steps, in order (sorted when all are integers, else as first seen)."""
    if any(r.step is None for r in records):
        raise RecordError("growth: a record has no step; give each record a step, or one file per step")
    seen = list(dict.fromkeys(r.step for r in records))
    return sorted(seen) if all(isinstance(s, int) for s in seen) else seen


def figure(ds: xr.Dataset) -> Figure:
    """Three panels: the mean gap per step; the token x step view (mean gap by position in the
    completion, per step); the growth from the first step split into its contributions."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8), layout="constrained")
    ax_gap, ax_map, ax_parts = fig.subplots(1, 3)
    steps = [str(s) for s in ds["step"].values]
    ax_gap.plot(steps, ds["gap"].values, marker="o")
    ax_gap.set(xlabel="step", ylabel="mean |Δ logprob| (nats)", title="gap per step")
    im = ax_map.imshow(ds["gap_by_position"].values, aspect="auto", origin="lower", cmap="magma",
                       extent=(-0.5, ds.sizes["position"] - 0.5, -0.5, len(steps) - 0.5))
    ax_map.set_yticks(range(len(steps)), steps)
    ax_map.set(xlabel="position in the completion", ylabel="step", title="token x step: mean |Δ logprob|")
    fig.colorbar(im, ax=ax_map, label="nats")
    parts = ds["contribution"].values  # [step, term]
    up, down = np.zeros(len(steps)), np.zeros(len(steps))
    for j, term in enumerate(ds["term"].values):
        vals = parts[:, j]
        base = np.where(vals >= 0, up, down)
        ax_parts.bar(steps, vals, bottom=base, label=str(term))
        up, down = up + vals.clip(min=0), down + vals.clip(max=0)
    ax_parts.plot(steps, ds["growth"].values, color="black", marker="o", label="growth")
    ax_parts.axhline(0, color="grey", lw=0.5)
    ax_parts.set(xlabel="step", ylabel="nats", title="growth from the first step, by cause")
    ax_parts.legend(fontsize=7)
    return fig
