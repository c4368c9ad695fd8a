"""MoE routing flips vs router margins, and R2/R3 router replay (CompassMax §2.4.4).

A bf16 rollout engine and an fp32 (or bf16) trainer compute slightly different router scores;
when a token's k-th and (k+1)-th expert scores are closer than that noise, the two engines pick
different experts and the token's log-prob moves by far more than the arithmetic noise alone.
Router replay removes that: R3 makes the trainer use the experts the rollout engine chose (its
``routed_experts``); R2 makes the trainer's update passes reuse the trainer's *own* old-pass
routing, which keeps training consistent with pi_old but leaves the train-inference gap as is.
CompassMax §2.4.4 reports router replay cutting the train-inference log-prob discrepancy from the
order of 1e-3 to 1e-4 (~10x).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import transformers
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from tqdm.auto import tqdm

import aligntools
from aligntools.analyzer.routing_diff import topk_rows
from aligntools.gates.inputs import prepare_tokens
from labs import zoo
from minirl import Engine, Knobs, SamplingParams
from minirl.quiet import quiet_when_asked
from minirl.training.trainer_forward import forward, trainer_logprobs

PAPER_REDUCTION = 10.0  # CompassMax §2.4.4: R3 makes the train-inference logprob gap ~10x smaller
MODEL = "tiny-qwen3-moe"


@dataclass
class Pair:
    """The two engines on one checkpoint, and their teacher-forced captures of the same text."""

    engine: Engine
    trainer: torch.nn.Module
    train: aligntools.Capture
    infer: aligntools.Capture

    def compare(self) -> aligntools.Comparison:
        return aligntools.compare(self.train, self.infer, labels=("trainer", "minirl:typical:bf16"))


def load(trainer_dtype: str = "float32", tokens: int = 256, model: str = MODEL) -> Pair:
    """The typical bf16 minirl rollout engine and the transformers trainer (``trainer_dtype``),
    both captured on ``tokens`` tokens of built-in text."""
    path = zoo.build(model)
    engine = Engine.from_pretrained(path, dtype="bfloat16", knobs=Knobs.typical_inference())
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, trainer_dtype)).eval()
    ids = prepare_tokens(path, tokens)
    return Pair(engine, hf, aligntools.capture(hf, ids, progress=False), aligntools.capture(engine, ids, progress=False))


def flip_margins(pair: Pair, layers: list[int]) -> pd.DataFrame:
    """One row per (MoE layer, token): the trainer's router margin (k-th minus (k+1)-th softmax
    score) and whether the engine picked another top-k set. Shows *why* tokens flip."""
    rows = []
    for layer in layers:
        ids_a, ids_b = pair.train[f"L{layer}.topk_ids"].values, pair.infer[f"L{layer}.topk_ids"].values
        logits = pair.train[f"L{layer}.router_logits"].values.astype(np.float64)
        p = np.exp(logits - logits.max(1, keepdims=True))
        top = -np.sort(-p / p.sum(1, keepdims=True), axis=1)
        k = ids_a.shape[1]
        rows.append(pd.DataFrame({"layer": layer, "margin": top[:, k - 1] - top[:, k],
                                  "flipped": topk_rows(ids_a, ids_b)["set_flip"] > 0}))
    return pd.concat(rows, ignore_index=True)


def flip_figure(routing: pd.DataFrame, margins: pd.DataFrame) -> Figure:
    """Left: share of tokens that changed expert set per layer. Right: margin distribution of
    all tokens vs flipped ones (flips live at the near-tie end)."""
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.bar(routing.index.astype(str), 100 * routing["set_flip"], color="#8e44ad")
    ax1.set(xlabel="MoE layer", ylabel="% tokens with another top-k set", title="routing flips per layer")
    bins = np.logspace(-7, 0, 36)
    m = margins["margin"].clip(lower=1e-7)
    ax2.hist(m, bins=bins, color="#95a5a6", label=f"all tokens ({len(m)})")
    ax2.hist(m[margins["flipped"]], bins=bins, color="#c0392b", label=f"flipped ({int(margins['flipped'].sum())})")
    ax2.set(xscale="log", yscale="log", xlabel="router margin (k-th - (k+1)-th score, trainer)",
            ylabel="token-layer pairs", title="router margin: all tokens vs flipped ones")
    ax2.legend(fontsize=8)
    return fig


@dataclass
class ReplayResult:
    """``per_token``: one row per generated token with |Δ logprob| (engine vs trainer) under
    each replay mode, and ``affected`` (the engines routed some earlier position differently);
    ``summary``: mean / max / mean over affected tokens per mode, and the reduction vs no replay."""

    per_token: pd.DataFrame
    summary: pd.DataFrame
    flips: pd.Series
    """Per MoE layer: share of positions (prompts and generated) where the engine's top-k set
    differs from the trainer's own routing."""

    @property
    def reduction(self) -> float:
        """Mean |Δ logprob| without replay / with R3 (CompassMax's ~10x is this ratio)."""
        return float(self.summary.loc["R3", "reduction"])


def replay_gap(engine: Engine, hf: torch.nn.Module, prompts: int = 8, n: int = 4, max_new_tokens: int = 32,
               seed: int = 0) -> ReplayResult:
    """Sample rollouts with the engine, then score them with the trainer three ways: its own
    routing, R2 (its own old-pass routing replayed: identical by construction at equal weights)
    and R3 (the engine's ``routed_experts``)."""
    rng = np.random.default_rng(seed)
    batch = [[1] + rng.integers(3, 500, size=8).tolist() for _ in range(prompts)]
    rollouts = [r for r in engine.generate(batch, SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=seed))
                if len(r.token_ids)]
    seqs = [list(r.prompt_ids) + list(r.token_ids) for r in rollouts]
    with torch.no_grad():
        r2 = forward(hf, seqs, record_routing=True).routing  # what R2 records in the old-logprob pass
    r3 = [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts]
    modes = {"no replay": trainer_logprobs(hf, seqs), "R2": trainer_logprobs(hf, seqs, routed_experts=r2),
             "R3": trainer_logprobs(hf, seqs, routed_experts=r3)}
    frames = []
    for i, r in enumerate(rollouts):
        p, t = len(r.prompt_ids), len(r.token_ids)
        infer = r.logprobs.double().numpy()
        flip = (r2[i].sort(-1).values != r3[i].sort(-1).values).any(-1).any(-1)  # [len] any layer rerouted
        affected = np.cumsum(flip.numpy())[p - 1: p - 1 + t] > 0  # a flip at or before the predicting position
        frames.append(pd.DataFrame({"rollout": i, "position": np.arange(t), "affected": affected,
                                    **{m: np.abs(lp[i][p - 1: p - 1 + t].double().numpy() - infer)
                                       for m, lp in modes.items()}}))
    per_token = pd.concat(frames, ignore_index=True)
    hit = per_token[per_token["affected"]]
    summary = pd.DataFrame({"mean": per_token[list(modes)].mean(), "max": per_token[list(modes)].max(),
                            "mean_affected": hit[list(modes)].mean() if len(hit) else np.nan})
    summary["reduction"] = summary.loc["no replay", "mean"] / summary["mean"]
    summary["reduction_max"] = summary.loc["no replay", "max"] / summary["max"]
    summary.index.name = "mode"
    return ReplayResult(per_token, summary, layer_flips(r2, r3, engine.moe_layers))


def layer_flips(trainer: list[torch.Tensor], engine: list[torch.Tensor], layers: list[int]) -> pd.Series:
    """Share of positions per MoE layer whose top-k expert *set* differs; inputs are per sequence
    [len, n_moe_layers, k] expert ids (the trainer's own routing, the engine's ``routed_experts``)."""
    flipped = torch.cat([(a.sort(-1).values != b.sort(-1).values).any(-1) for a, b in zip(trainer, engine)])
    return pd.Series(flipped.double().mean(0).numpy(), index=pd.Index(layers, name="layer"), name="flip_rate")


@quiet_when_asked
def depth_comparison(models: tuple[str, ...] = (MODEL, "tiny-moe-deep"), weights: tuple[str, ...] = ("none", "fp8_e4m3"),
                     prompts: int = 16, n: int = 4, max_new_tokens: int = 64, seed: int = 0,
                     trainer_dtype: str = "float32", progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """R3 on a shallow and a deep MoE, for bf16 rollouts and quantized ones (``Knobs.weights``;
    ``none`` = plain bf16). The typical bf16 minirl engine samples, a transformers trainer in
    ``trainer_dtype`` scores (``bfloat16``: the bf16-vs-bf16 pair CompassMax's figure is about).
    Returns (summary indexed by [model, rollout] with mean / max |Δ logprob| without
    replay and with R3, R3's factor on each, and the mean flip rate; per-layer flip rates, one
    column per (model, rollout)). Why: most of a 4-layer top-2 toy's gap is arithmetic, so R3
    barely helps; in deep, wide, top-8 MoEs flips compound layer after layer."""
    rows, flips = [], {}
    runs = [(m, w) for m in models for w in weights]
    for model, fmt in tqdm(runs, desc="R3 by depth", unit="run", disable=not progress):
        path = zoo.build(model)
        engine = Engine.from_pretrained(path, dtype="bfloat16", knobs=Knobs.typical_inference().replace(weights=fmt))
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, trainer_dtype)).eval()
        res = replay_gap(engine, hf, prompts=prompts, n=n, max_new_tokens=max_new_tokens, seed=seed)
        s, rollout = res.summary, "bf16" if fmt == "none" else f"bf16+{fmt}"
        rows.append({"model": model, "rollout": rollout, "layers": engine.n_layers,
                     "tokens": len(res.per_token), "mean_no_replay": s.loc["no replay", "mean"],
                     "mean_R3": s.loc["R3", "mean"], "R3_factor_mean": s.loc["R3", "reduction"],
                     "max_no_replay": s.loc["no replay", "max"], "max_R3": s.loc["R3", "max"],
                     "R3_factor_max": s.loc["R3", "reduction_max"], "flip_rate": float(res.flips.mean())})
        flips[model, rollout] = res.flips
    return pd.DataFrame(rows).set_index(["model", "rollout"]), pd.DataFrame(flips)


def depth_figure(summary: pd.DataFrame, flips: pd.DataFrame) -> Figure:
    """Left: flip rate per MoE layer, one line per (model, rollout). Right: R3's factor on the
    mean and the max |Δ logprob| per run, next to CompassMax's ~10x."""
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    for (model, rollout), rates in flips.items():
        rates = rates.dropna()
        ax1.plot(rates.index, 100 * rates.values, marker=".", label=f"{model}, {rollout}")
    ax1.set(xlabel="MoE layer", ylabel="% positions with another top-k set", title="routing flips per layer")
    ax1.legend(fontsize=8)
    labels = [f"{m}\n{r}" for m, r in summary.index]
    x = np.arange(len(labels))
    ax2.bar(x - 0.2, summary["R3_factor_mean"], 0.4, color="#2c7fb8", label="mean |Δ logprob|")
    ax2.bar(x + 0.2, summary["R3_factor_max"], 0.4, color="#95a5a6", label="max |Δ logprob|")
    ax2.axhline(PAPER_REDUCTION, ls="--", c="gray", label=f"CompassMax §2.4.4: ~{PAPER_REDUCTION:.0f}x")
    ax2.axhline(1.0, c="black", lw=0.8)
    ax2.set_xticks(x, labels, fontsize=7)
    ax2.set(yscale="log", ylabel="no replay / R3", title="R3's factor on the train-inference gap")
    ax2.legend(fontsize=8)
    return fig


def replay_figure(res: ReplayResult) -> Figure:
    """Distribution of per-token |Δ logprob| without replay, R2 and R3, next to the paper's 10x.

    Bins span the data's own decades (``log_bins``): a fixed 1e-9..1e1 range put the data of a
    real run (1e-6..1e-1) into half the axis. Tokens whose gap is exactly 0 (R3 can reproduce the
    engine bit for bit) have no place on a log axis; they get their own bin, left of the rest,
    with a tick that reads 0."""
    fig = Figure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    modes = (("no replay", "#c0392b"), ("R2", "#f39c12"), ("R3", "#2c7fb8"))
    edges, zero_at = log_bins(np.concatenate([res.per_token[m].to_numpy(float) for m, _ in modes]))
    for mode, color in modes:
        v = res.per_token[mode].to_numpy(float)
        shown = np.where(v == 0, zero_at, v) if zero_at is not None else v
        ax.hist(shown, bins=edges, histtype="step", lw=2, color=color, label=f"{mode}: mean {v.mean():.2g}")
    ax.set(xscale="log", xlabel="|Δ logprob| per generated token (engine vs trainer)", ylabel="tokens",
           title=f"R3 shrinks the mean gap {res.reduction:.1f}x (CompassMax §2.4.4: ~{PAPER_REDUCTION:.0f}x)")
    ax.set_xlim(edges[0], edges[-1])
    decades = 10.0 ** np.arange(np.ceil(np.log10(edges[1 if zero_at is not None else 0])),
                                np.floor(np.log10(edges[-1])) + 1)
    if zero_at is not None:  # a decade tick next to the zero bin would print over its "0"
        decades = decades[decades > zero_at * 10 ** (2 / 3)]
    ticks = ([zero_at] if zero_at is not None else []) + decades.tolist()
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: "0" if x == zero_at else f"1e{np.log10(x):.0f}"))
    if zero_at is not None:
        ax.axvline(edges[1], color="0.5", lw=0.8, ls=":")  # the zero bin is not part of the log scale
    ax.legend(fontsize=8)
    return fig


BINS_PER_DECADE = 6


def log_bins(values: np.ndarray) -> tuple[np.ndarray, float | None]:
    """Log-spaced bin edges over the decades ``values`` occupy (``BINS_PER_DECADE`` each), and
    where exact zeros are drawn: the centre of one extra bin in front (None without zeros).
    NaN is ignored; only zeros (or nothing) give one bin around 1e-9 so the plot still draws."""
    v = np.asarray(values, dtype=float)
    pos = v[np.isfinite(v) & (v > 0)]
    lo, hi = (np.floor(np.log10(pos.min())), np.ceil(np.log10(pos.max()))) if len(pos) else (-9.0, -8.0)
    hi = max(hi, lo + 1)
    edges = np.logspace(lo, hi, round((hi - lo) * BINS_PER_DECADE) + 1)
    if not (v == 0).any():
        return edges, None
    step = edges[1] / edges[0]
    return np.concatenate([[edges[0] / step], edges]), float(edges[0] / step ** 0.5)
