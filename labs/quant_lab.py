"""Quantized rollouts: how far FP8 / INT8 / INT4 rollout weights move the logprobs of the
sampled tokens away from an fp32 trainer, and what IcePop and TIS make of that gap.

Why: real RL stacks sample from quantized weights (FlashRL's INT8/FP8 rollouts corrected by
TIS, QeRL, FP8 rollouts in verl and slime) while the trainer keeps full precision. bf16
arithmetic alone barely moves a token's ratio ``rho = pi_train / pi_infer`` out of IcePop's
[0.5, 5] band on these models; quantized weights are the mismatch real practice runs with.
Per format, the typical bf16 minirl engine (``Knobs.weights`` set, everything else as vLLM
does) samples continuations of built-in text, a float32 transformers model scores them, and
the per-token gap, the corrections' masked / capped shares and (MoE) the routing flips are
measured on exactly those tokens.

    python -m labs.quant_lab --model tiny-qwen3-moe --model smollm2-135m
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import transformers
import xarray as xr
from matplotlib.figure import Figure
from tqdm.auto import tqdm

import minirl
from aligntools.gates.inputs import prepare_tokens
from labs import narrate, zoo
from labs.routing_lab import layer_flips
from minirl import Engine, Knobs, SamplingParams
from minirl.algorithms import corrections
from minirl.engine.quantize import FORMATS
from minirl.quiet import quiet_when_asked
from minirl.training.trainer import pack
from minirl.training.trainer_forward import forward

MODELS = ("tiny-qwen3-moe", "smollm2-135m")
ARMS = {"GRPO": "none", "TIS": "tis", "IcePop": "icepop", "MIS": "mis"}  # arm label -> TrainConfig.correction
COLORS = {"GRPO": "#c0392b", "TIS": "#f39c12", "IcePop": "#2c7fb8", "MIS": "#27ae60"}


@quiet_when_asked
def measure(model: str = "tiny-qwen3-moe", formats: tuple[str, ...] = FORMATS, prompts: int = 8, n: int = 4,
            prompt_tokens: int = 16, max_new_tokens: int = 32, engine_dtype: str = "bfloat16", seed: int = 0,
            trainer_dtype: str = "float32", progress: bool = True) -> pd.DataFrame:
    """One row per weight format (``none`` = plain ``engine_dtype`` rollouts): sampled tokens,
    mean / max |Δ logprob| vs the trainer (transformers in ``trainer_dtype``: ``bfloat16`` is the
    bf16 trainer's side, ``TrainConfig.trainer_dtype``), mismatch KL (k3), the per-mille of tokens IcePop
    masks (rho outside [0.5, 5]) and TIS caps (rho > 2), and for MoE models the share of
    (position, layer) pairs whose top-k expert set differs from the trainer's."""
    path = zoo.build(model)
    trainer = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, trainer_dtype)).eval()
    batch = prepare_tokens(path, prompts * prompt_tokens, n_seqs=prompts).tolist()  # [prompts, prompt_tokens]
    rows = []
    for fmt in tqdm(formats, desc=f"quantized rollouts, {model}", unit="format", disable=not progress):
        engine = Engine.from_pretrained(path, dtype=engine_dtype, knobs=Knobs.typical_inference().replace(weights=fmt))
        b = pack(engine.generate(batch, SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=seed)))
        with torch.no_grad():
            out = forward(trainer, b.sequences, record_routing=b.routed is not None)
        logp = out.logp * b.mask
        _, _, ice = corrections.icepop(logp, b.logp_infer, b.mask)
        _, _, tis = corrections.tis(logp, b.logp_infer, b.mask)
        flips = float(layer_flips(out.routing, b.routed, engine.moe_layers).mean()) if b.routed else math.nan
        rows.append({"weights": fmt, "tokens": int(b.mask.sum()), "abs_dlogp_mean": ice["abs_dlogp_mean"],
                     "abs_dlogp_max": ice["abs_dlogp_max"], "mismatch_kl_k3": ice["mismatch_kl_k3"],
                     "icepop_masked_permille": 1000 * ice["frac_masked"],
                     "tis_capped_permille": 1000 * tis["frac_clipped_high"], "flip_rate": flips})
    table = pd.DataFrame(rows).set_index("weights")
    table.attrs = {"model": model, "engine": "minirl:typical", "engine_dtype": engine_dtype, "trainer": f"hf:{trainer_dtype}",
                   "prompts": prompts, "n": n, "max_new_tokens": max_new_tokens, "seed": seed}
    return table


@quiet_when_asked
def train_arms(formats: tuple[str, ...] = ("fp8_e4m3", "int4"), steps: int = 30, prompts_per_step: int = 8,
               group_size: int = 8, max_new_tokens: int = 8, sft_steps: int = 100, n_eval: int = 32,
               eval_every: int = 5, model: str = "tiny-qwen3-moe", seed: int = 0, lr: float = 1e-3,
               out_dir: str | None = None, progress: bool = True) -> xr.Dataset:
    """One ``minirl.train`` run per (rollout weight format, correction), all with the same seed,
    config and SFT warm start: only the rollout engine's ``weights`` knob and the correction
    differ. Returns every logged metric as [weights, arm, step] variables (``eval_accuracy`` on
    held-out problems every ``eval_every`` steps, NaN between)."""
    path = str(zoo.build(model))
    root = Path(out_dir or tempfile.mkdtemp(prefix="quant_lab_"))
    frames = []
    runs = [(fmt, arm) for fmt in formats for arm in ARMS]
    for fmt, arm in tqdm(runs, desc="quantized-rollout RL runs", unit="run", disable=not progress):
        cfg = minirl.TrainConfig(model=path, sft_steps=sft_steps, task="arithmetic", task_kwargs={"digits": 1},
                                 n_train=64, n_eval=n_eval, prompts_per_step=prompts_per_step, group_size=group_size,
                                 max_new_tokens=max_new_tokens, steps=steps, eval_every=eval_every,
                                 checkpoint_every=0, engine=f"minirl:typical,weights={fmt}", engine_dtype="bfloat16",
                                 correction=ARMS[arm], lr=lr, seed=seed, out_dir=str(root / fmt / arm), progress=False)
        rows = minirl.train(cfg).rows
        frames.append(pd.DataFrame(rows).assign(weights=fmt, arm=arm, step=range(len(rows))))
    ds = xr.Dataset.from_dataframe(pd.concat(frames).set_index(["weights", "arm", "step"]))
    ds = ds.reindex(weights=list(formats), arm=list(ARMS))
    ds.attrs = {"engine": "minirl:typical", "engine_dtype": "bfloat16", "trainer_dtype": "float32", "model": model,
                "steps": steps, "batch": prompts_per_step * group_size, "lr": lr, "seed": seed}
    return ds


def curves_figure(ds: xr.Dataset) -> Figure:
    """Held-out accuracy and gradient norm per step, one line per correction, one column per
    rollout weight format (Ring-1T Figs 10-11; FlashRL: TIS recovers the bf16-rollout curve)."""
    formats = [str(f) for f in ds["weights"].values]
    fig = Figure(figsize=(5 * len(formats), 6), layout="constrained")
    axes = fig.subplots(2, len(formats), squeeze=False)
    for col, fmt in enumerate(formats):
        for row, (var, title) in enumerate((("eval_accuracy", "held-out accuracy"), ("grad_norm", "gradient norm"))):
            ax = axes[row, col]
            for arm in ARMS:
                da = ds[var].sel(weights=fmt, arm=arm)
                keep = ~np.isnan(da.values)
                ax.plot(ds["step"].values[keep], da.values[keep], marker=".", color=COLORS[arm], label=arm)
            ax.set(xlabel="step", title=f"{title}, {fmt} rollouts vs fp32 trainer")
    axes[0, 0].legend(fontsize=8)
    return fig


def format_figure(table: pd.DataFrame) -> Figure:
    """``measure``'s table as two panels: mean |Δ logprob| per format (log scale, bf16 alone as
    the dashed floor) and IcePop's masked ‰ per format with its binomial noise, next to
    Ring-1T's 1-2‰ band: how big each format's gap is, and whether IcePop sees it."""
    from labs.icepop_lab import PAPER_MASKED_PERMILLE

    fig = Figure(figsize=(9, 3.2), layout="constrained")
    gap, masked = fig.subplots(1, 2)
    names = list(table.index)
    gap.plot(names, table["abs_dlogp_mean"], "o", color="#2c7fb8", ms=8)  # log scale: points, not bars
    if "none" in table.index:
        gap.axhline(table.loc["none", "abs_dlogp_mean"], color="k", ls="--", lw=1, label="bf16 weights (none)")
        gap.legend(fontsize=8)
    gap.set(yscale="log", ylabel="mean |Δ logprob| per token (nats)", xlabel="rollout weights",
            title="gap to the fp32 trainer")
    noise = [narrate.share_noise(r["icepop_masked_permille"], int(r["tokens"])) for _, r in table.iterrows()]
    masked.bar(names, table["icepop_masked_permille"], yerr=noise, color="#c0392b", capsize=3)
    lo, hi = PAPER_MASKED_PERMILLE
    masked.axhspan(lo, hi, color="0.85", label=f"Ring-1T {lo:.0f}-{hi:.0f}‰")
    masked.set(ylabel="tokens IcePop masks (‰)", xlabel=f"rollout weights ({_tokens(table)} tokens each)",
               ylim=(0, max(2 * hi, 1.2 * float((table["icepop_masked_permille"] + noise).max()))),
               title="IcePop masked share (±2 s.e.)")
    masked.legend(fontsize=8)
    return fig


def reading(table: pd.DataFrame) -> str:
    """The notebook's paragraph on ``measure``'s table, every number and verdict computed from it:
    each format's gap against bf16 alone (``narrate.magnitude``), IcePop's masked share against
    its binomial noise and the paper's band, and (MoE) the routing flips it comes with."""
    from labs.icepop_lab import PAPER_MASKED_PERMILLE

    base = table.loc["none"]
    quant = table.drop(index="none")
    gaps = "; ".join(narrate.magnitude(r["abs_dlogp_mean"], base["abs_dlogp_mean"], f"{fmt}'s gap", "bf16 alone")
                     for fmt, r in quant.iterrows())
    lo, hi = PAPER_MASKED_PERMILLE
    resolved = {fmt: r["icepop_masked_permille"] for fmt, r in table.iterrows()
                if r["icepop_masked_permille"] > narrate.share_noise(r["icepop_masked_permille"], int(r["tokens"]))}
    if resolved:
        where = {f: "inside" if lo <= v <= hi else ("below" if v < lo else "above") for f, v in resolved.items()}
        unresolved = [_label(f) for f in table.index if f not in resolved]
        masked = ("IcePop masks " + ", ".join(f"{v:.1f}‰ of the tokens under {_label(f)} ({where[f]} Ring-1T's "
                                              f"{lo:.0f}-{hi:.0f}‰)" for f, v in resolved.items())
                  + (f", and no share above its binomial noise under {', '.join(unresolved)}" if unresolved else ""))
    else:
        most, widest = table["icepop_masked_permille"].max(), quant["abs_dlogp_mean"].idxmax()
        inside = "for all but a few tokens" if most > 0 else "for every token"
        at_most = f"at most {most:.1f}‰" if most > 0 else "not one token"
        masked = (f"IcePop masks no share above its binomial noise under any format ({at_most}): rho stays inside "
                  f"[0.5, 5] {inside} even with {widest}'s weights, so on this model IcePop's band does not see the "
                  "quantized gap")
    flips = ""
    if table["flip_rate"].notna().all():
        worst = quant["flip_rate"].idxmax()
        flips = (f" Routing moves too: under {worst} {100 * table.loc[worst, 'flip_rate']:.2f}% of (position, MoE "
                 f"layer) pairs pick another top-k set than the trainer, against {100 * base['flip_rate']:.2f}% "
                 "with bf16 weights.")
    return f"**Reading it.** Over {_tokens(table)} sampled tokens per format: {gaps}. {masked}.{flips}"


def _tokens(table: pd.DataFrame) -> str:
    lo, hi = int(table["tokens"].min()), int(table["tokens"].max())
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _label(fmt: str) -> str:
    return "bf16 weights" if fmt == "none" else fmt


def markdown(tables: list[pd.DataFrame]) -> str:
    """The docs table: one row per (model, format)."""
    lines = ["| model | rollout weights | tokens | mean \\|Δ logprob\\| | max \\|Δ logprob\\| | mismatch KL (k3) "
             "| IcePop masked ‰ | TIS capped ‰ | routing flips |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in tables:
        for fmt, r in t.iterrows():
            flips = "—" if math.isnan(r["flip_rate"]) else f"{100 * r['flip_rate']:.2f}%"
            label = t.attrs["engine_dtype"] if fmt == "none" else f"{fmt} ({t.attrs['engine_dtype']} activations)"
            lines.append(f"| {t.attrs['model']} | {label} | {int(r['tokens'])} | {r['abs_dlogp_mean']:.3g} "
                         f"| {r['abs_dlogp_max']:.3g} | {r['mismatch_kl_k3']:.2g} | {r['icepop_masked_permille']:.1f} "
                         f"| {r['tis_capped_permille']:.1f} | {flips} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labs.quant_lab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", choices=zoo.names(), help="zoo model (repeatable; default: "
                    + ", ".join(MODELS) + ")")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trainer-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="what the scoring trainer computes in (bfloat16: the bf16 trainer's side)")
    args = ap.parse_args(argv)
    tables = [measure(m, prompts=args.prompts, n=args.n, max_new_tokens=args.max_new_tokens, seed=args.seed,
                      trainer_dtype=args.trainer_dtype) for m in args.model or MODELS]
    print(markdown(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
