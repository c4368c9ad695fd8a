"""Routing flips per layer on a deep MoE, and what R3 does to the train-inference KL.

Why: R3 (Ma et al., arXiv 2510.11370) measured on Qwen3-30B-A3B that ~10 % of the routers
pick other experts in training than in inference, and that 94 % of tokens see such a flip in at
least one layer: flips are rare per layer and near-certain per token once layers compound. The
``router_replay_deep`` entry gave a mean flip rate of the zoo's deep MoE (16 layers, 64 experts
top-8); here the per-layer rate, the share of tokens with >= 1 flip, and the k3 estimate of
KL(pi_infer || pi_train) on the sampled tokens with the trainer's own routing and with R3 (the
engine's ``routed_experts`` replayed), over seeds (each seed draws other prompts and samples).

Verdict rule, fixed before the runs (``RULE``): the per-token figure "reproduces" when the 95 %
interval over seeds of the share of tokens with >= 1 flip reaches 50 % (most tokens flip
somewhere, as the paper's 94 %); R3 "lowers the KL" when the per-seed KL ratio (no replay / R3)
has its 95 % interval above 1.

Each (trainer dtype, seed) is an arm cached as ``<arms>/<dtype>_seed<s>.nc``: a killed entry resumes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr

PAPER_LAYER_FLIP = 0.10  # R3 paper: ~10 % of routers differ between training and inference (Qwen3-30B-A3B)
PAPER_TOKEN_FLIP = 0.94  # R3 paper: 94 % of tokens have a different expert in at least one layer
RULE = ("reproduced when the 95 % interval over seeds of the share of tokens with >= 1 flipped layer reaches 50 %; "
        "R3 lowers the KL when the interval of the per-seed KL ratio (no replay / R3) is above 1")


@dataclass(frozen=True)
class Sizes:
    """The full size's defaults: the deep MoE, the bf16 typical engine (the paper's rollouts) against
    the fp32 trainer and the bf16 one (the paper's pair: both sides bf16, other kernels)."""

    model: str = "tiny-moe-deep"
    trainer_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    seeds: tuple[int, ...] = (0, 1, 2)
    prompts: int = 8
    n: int = 4
    max_new_tokens: int = 32


SMALL = Sizes(model="tiny-qwen3-moe", trainer_dtypes=("float32",), seeds=(0, 1), prompts=2, n=2, max_new_tokens=6)


def measure_seed(engine, hf: torch.nn.Module, sizes: Sizes, seed: int) -> xr.Dataset:  # noqa: ANN001 - an Engine
    """One seed: sample ``prompts`` x ``n`` rollouts (random token prompts, as ``routing_lab``), score
    them with the trainer's own routing and with R3 -> per-layer flip rate over every position,
    share of positions (and of generated tokens) with >= 1 flipped layer, k3 KL per mode."""
    from labs.routing_lab import layer_flips
    from minirl import SamplingParams
    from minirl.training.trainer_forward import forward, trainer_logprobs

    rng = np.random.default_rng(seed)
    prompts = [[1] + rng.integers(3, 500, size=8).tolist() for _ in range(sizes.prompts)]
    rollouts = [r for r in engine.generate(prompts, SamplingParams(n=sizes.n, max_new_tokens=sizes.max_new_tokens,
                                                                   seed=seed)) if len(r.token_ids)]
    seqs = [list(r.prompt_ids) + list(r.token_ids) for r in rollouts]
    with torch.no_grad():
        own = forward(hf, seqs, record_routing=True).routing  # per sequence [len, n_moe, k]
    replayed = [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts]
    flips = layer_flips(own, replayed, engine.moe_layers)
    any_flip = [(a.sort(-1).values != b.sort(-1).values).any(-1).any(-1) for a, b in zip(own, replayed)]  # [len]
    generated = torch.cat([f[len(r.prompt_ids):] for f, r in zip(any_flip, rollouts)])
    infer = torch.cat([r.logprobs.double() for r in rollouts])
    k3 = {}
    for mode, routed in (("none", None), ("R3", replayed)):
        lp = trainer_logprobs(hf, seqs, routed_experts=routed)
        d = torch.cat([x[len(r.prompt_ids) - 1:].double() for x, r in zip(lp, rollouts)]) - infer  # log rho
        k3[mode] = float((d.exp() - 1 - d).mean())
    return xr.Dataset({"flip_rate": ("layer", flips.to_numpy()),
                       "token_flip_share": float(torch.cat(any_flip).double().mean()),
                       "generated_flip_share": float(generated.double().mean()),
                       "k3": ("replay", [k3["none"], k3["R3"]])},
                      coords={"layer": flips.index.to_numpy(), "replay": ["none", "R3"]})


def measure(sizes: Sizes, arms_dir: Path) -> xr.Dataset:
    """Every (trainer dtype, seed) arm, ``on_policy_lab.cached`` per arm under its recipe (the sizes, the
    dtype, the seed) -> dims (trainer_dtype, seed, layer / replay). The engine and each trainer load only
    when an arm is measured."""
    import transformers

    from labs import zoo
    from labs.on_policy_lab import cached
    from minirl import Engine, Knobs

    path = zoo.build(sizes.model)
    engine = functools.cache(lambda: Engine.from_pretrained(path, dtype="bfloat16", knobs=Knobs.typical_inference()))
    shared = {k: v for k, v in dataclasses.asdict(sizes).items() if k not in ("seeds", "trainer_dtypes")}
    per_dtype = []
    for dtype in sizes.trainer_dtypes:
        hf = functools.cache(lambda dtype=dtype: transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype)).eval())
        arms = [cached(arms_dir / f"{dtype}_seed{seed}.nc",
                       json.dumps({**shared, "trainer_dtype": dtype, "seed": seed}, sort_keys=True),
                       lambda seed=seed: measure_seed(engine(), hf(), sizes, seed)) for seed in sizes.seeds]
        per_dtype.append(xr.concat(arms, pd.Index(sizes.seeds, name="seed")))
    return xr.concat(per_dtype, pd.Index(list(sizes.trainer_dtypes), name="trainer_dtype"))


def verdict(ds: xr.Dataset) -> tuple[str, dict[str, float]]:
    """``RULE`` per trainer dtype, as a sentence and numbers (means and 95 % intervals over seeds)."""
    from minirl.training.plot import mean_ci

    iv = lambda ci, f=100: "" if ci is None else f" [{ci[0] * f:.1f}, {ci[1] * f:.1f}]"  # noqa: E731
    parts, numbers = [], {}
    for dtype in ds["trainer_dtype"].values:
        d = ds.sel(trainer_dtype=dtype)
        layer, layer_ci = mean_ci(d["flip_rate"].mean("layer").values)
        token, token_ci = mean_ci(d["token_flip_share"].values)
        ratio, ratio_ci = mean_ci((d["k3"].sel(replay="none") / d["k3"].sel(replay="R3")).values)
        kl_none, kl_r3 = float(d["k3"].sel(replay="none").mean()), float(d["k3"].sel(replay="R3").mean())
        reproduced = token_ci is not None and token_ci[1] >= 0.5
        lowers = ratio_ci is not None and ratio_ci[0] > 1
        worst = int(np.argmax(d["flip_rate"].mean("seed").to_numpy()))
        parts.append(f"{dtype} trainer: {layer:.1%}{iv(layer_ci)} flips per layer (paper ~{PAPER_LAYER_FLIP:.0%}; "
                     f"layer {int(d['layer'][worst])} highest at {float(d['flip_rate'].mean('seed')[worst]):.1%}), "
                     f"{token:.1%}{iv(token_ci)} of tokens with >= 1 flip (paper {PAPER_TOKEN_FLIP:.0%}): "
                     f"{'reproduced' if reproduced else 'not reproduced'}; k3 KL {kl_none:.2g} -> {kl_r3:.2g} with R3, "
                     f"ratio {ratio:.2f}{iv(ratio_ci, 1)}: {'R3 lowers the KL' if lowers else 'not shown to lower it'}")
        numbers.update({f"layer_flip_rate {dtype}": layer, f"token_flip_share {dtype}": token,
                        f"k3_none {dtype}": kl_none, f"k3_R3 {dtype}": kl_r3, f"k3_ratio {dtype}": ratio,
                        f"reproduced {dtype}": float(reproduced), f"r3_lowers_kl {dtype}": float(lowers)})
    return f"over {ds.sizes['seed']} seeds: " + "; ".join(parts), numbers


def figure(ds: xr.Dataset) -> "Figure":
    """Flip rate per layer (mean over seeds, each seed faint) per trainer dtype, the paper's ~10 % dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.4))
    ax = fig.subplots()
    for dtype in ds["trainer_dtype"].values:
        rates = ds["flip_rate"].sel(trainer_dtype=dtype)
        line, = ax.plot(ds["layer"], 100 * rates.mean("seed"), marker="o", label=f"{dtype} trainer")
        for seed in ds["seed"].values:
            ax.plot(ds["layer"], 100 * rates.sel(seed=seed), color=line.get_color(), alpha=0.25, lw=0.8)
    ax.axhline(100 * PAPER_LAYER_FLIP, ls="--", c="grey", label="R3 paper, Qwen3-30B-A3B")
    ax.set(xlabel="MoE layer", ylabel="routing flips (% of positions)", title="bf16 engine vs trainer routing")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
