"""FP16 against BF16: the train-inference mismatch when both sides compute in fp16, and when
both compute in bf16, on the same prompts and seeds.

Why: Qi et al. (arXiv 2510.26788, §3) argue that the mismatch is a rounding problem, and that
fp16's 10 mantissa bits (bf16 has 7) remove most of it for the price of loss scaling. Here the
rollout engine (minirl, ``typical`` knobs) samples completions in one dtype and the trainer's
compute copy (transformers, the same dtype, its fused log-prob path) scores them; the gap
between their log-probs of the sampled tokens is the mismatch the RL correction has to absorb.
Verdict rule, fixed before the runs: fp16 "removes most of the mismatch" when its mean
|Δ logprob| is below half of bf16's and the two 95 % intervals over seeds do not overlap.

    from labs import precision_lab
    table = precision_lab.compare(".zoo/smollm2-135m-seed0", seeds=(0, 1, 2))
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

DTYPES = ("bfloat16", "float16")


def mismatch(path: str | Path, dtype: str, seed: int, prompts: int = 8, new_tokens: int = 32) -> dict[str, float]:
    """One seed: the engine samples ``prompts`` completions of ``new_tokens`` in ``dtype``, the
    trainer in ``dtype`` scores them -> mean and max |Δ logprob|, k3 KL estimate, and the share of
    non-finite log-probs (fp16 can overflow where bf16 does not)."""
    from aligntools.gates.inputs import prepare_tokens
    from minirl.engine.sampling import NonFiniteLogitsError, SamplingParams
    from minirl.engines import build_engine, load_hf
    from minirl.training.trainer_forward import trainer_logprobs

    ids = prepare_tokens(Path(path), prompts * 16, n_seqs=prompts)  # [prompts, 16] of built-in text
    engine = build_engine("minirl:typical", path, dtype, rollouts=True)
    try:
        rollouts = engine.generate(ids.tolist(), SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, seed=seed))
    except NonFiniteLogitsError:  # the dtype overflows on this model (Gemma 3 in fp16): a finding, not a crash
        return {"mean_abs_dlogp": math.nan, "max_abs_dlogp": math.nan, "k3": math.nan, "non_finite": 1.0}
    trainer = load_hf(path, dtype)
    scored = trainer_logprobs(trainer, [r.prompt_ids + r.token_ids for r in rollouts])
    train = torch.cat([s[len(r.prompt_ids) - 1:] for s, r in zip(scored, rollouts)]).double()  # [N]
    infer = torch.cat([r.logprobs for r in rollouts]).double()  # [N]
    finite = torch.isfinite(train) & torch.isfinite(infer)
    d = (train - infer)[finite]  # log rho, rho = pi_train / pi_infer
    return {"mean_abs_dlogp": float(d.abs().mean()), "max_abs_dlogp": float(d.abs().max()),
            "k3": float((d.exp() - 1 - d).mean()), "non_finite": float(1 - finite.double().mean())}


def compare(path: str | Path, seeds: tuple[int, ...] = (0, 1, 2), **kwargs: int) -> pd.DataFrame:
    """Both dtypes over ``seeds`` -> one row per (dtype, seed)."""
    rows = [{"dtype": dtype, "seed": seed, **mismatch(path, dtype, seed, **kwargs)}
            for dtype in tqdm(DTYPES, desc="precision arms") for seed in seeds]
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame) -> tuple[str, dict[str, float]]:
    """The sentence and numbers the rule in the module docstring gives for ``table``."""
    from minirl.training.plot import mean_ci

    stats = {d: mean_ci(table.loc[table["dtype"] == d, "mean_abs_dlogp"].to_numpy()) for d in DTYPES}
    (b_mean, b_ci), (h_mean, h_ci) = stats["bfloat16"], stats["float16"]
    numbers = {"bf16_mean": b_mean, "fp16_mean": h_mean, "ratio": h_mean / b_mean if b_mean else math.nan,
               "holds": float(b_ci is not None and h_ci is not None and h_ci[1] < b_ci[0] and h_mean < 0.5 * b_mean)}
    holds = bool(numbers["holds"])
    interval = lambda ci: f"[{ci[0]:.2g}, {ci[1]:.2g}]" if ci else "(one seed: no interval)"  # noqa: E731
    reading = ("fp16 removes most of the mismatch" if holds else
               "fp16's mean is under half of bf16's, but the intervals overlap: not shown at this seed count"
               if h_mean < 0.5 * b_mean else "fp16 does not remove most of the mismatch here")
    text = (f"mean |Δ logprob| fp16 {h_mean:.3g} {interval(h_ci)} vs bf16 {b_mean:.3g} {interval(b_ci)} over "
            f"{table['seed'].nunique()} seeds (fp16/bf16 = {numbers['ratio']:.2f}): {reading}")
    fp16 = table.loc[table["dtype"] == "float16", "non_finite"]
    if (fp16 == 1.0).all():
        return (f"fp16 overflows on this model: the engine's logits were not finite in all {len(fp16)} seeds "
                f"(bf16: mean |Δ logprob| {b_mean:.3g} {interval(b_ci)})"), {**numbers, "holds": 0.0}
    if fp16.max() > 0:
        text += f"; {fp16.max():.1%} of fp16 log-probs were not finite (overflow) and are left out"
    return text, numbers


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95 % interval per dtype of each mismatch statistic (the README's row)."""
    from minirl.training.plot import mean_ci

    out = {}
    for dtype, group in table.groupby("dtype"):
        for col in ("mean_abs_dlogp", "max_abs_dlogp", "k3"):
            mean, ci = mean_ci(group[col].to_numpy())
            out[(dtype, col)] = {"mean": mean, "ci_low": ci[0] if ci else np.nan, "ci_high": ci[1] if ci else np.nan}
    return pd.DataFrame(out).T


def figure(tables: dict[str, pd.DataFrame]) -> "Figure":
    """Mean |Δ logprob| per dtype and model, each seed a dot, the mean a bar (log scale)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2.6 * len(tables) + 1, 3.2))
    axes = fig.subplots(1, len(tables), squeeze=False)[0]
    for ax, (model, table) in zip(axes, tables.items()):
        for x, dtype in enumerate(DTYPES):
            values = table.loc[table["dtype"] == dtype, "mean_abs_dlogp"].to_numpy()
            ax.bar(x, values.mean(), color=("tab:orange", "tab:blue")[x], alpha=0.5)
            ax.plot([x] * len(values), values, "k.", ms=5)
        ax.set_xticks(range(len(DTYPES)), DTYPES)
        ax.set_yscale("log")
        ax.set_title(model, fontsize=9)
    axes[0].set_ylabel("mean |Δ logprob| (trainer vs engine)")
    fig.tight_layout()
    return fig
