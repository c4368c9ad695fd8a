"""FP16 against BF16: the train-inference mismatch when both sides compute in fp16, and when
both compute in bf16, on the same prompts and seeds.

Why: Qi et al. (arXiv 2510.26788, §3) argue that the mismatch is a rounding problem, and that
fp16's 10 mantissa bits (bf16 has 7) remove most of it for the price of loss scaling. Here the
rollout engine (minirl, ``typical`` knobs) samples completions in one dtype and the trainer's
compute copy (transformers, the same dtype, its fused log-prob path) scores them; the gap
between their log-probs of the sampled tokens is the mismatch the RL correction has to absorb.
Verdict rule, fixed before the runs: fp16 "removes most of the mismatch" when its mean
|Δ logprob| is below half of bf16's and the two 95 % intervals over seeds do not overlap.

Then RL (§4 of the paper): the same GRPO run with both sides in fp16 (``trainer_dtype: float16``,
dynamic loss scaling), and with both in bf16, over seeds (``rl_arms``, ``RL_RULE``): the mismatch
over steps, whether it grows, the reward and the held-out accuracy.

    from labs import precision_lab
    table = precision_lab.compare(".zoo/smollm2-135m-seed0", seeds=(0, 1, 2))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr
from tqdm.auto import tqdm

from minirl.quiet import quiet_when_asked

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


RL_RULE = ("fp16 keeps the RL mismatch down when the per-seed mean over steps of the step's mean |Δ logprob| is under "
           "half of bf16's and the two 95 % intervals over seeds do not overlap; the mismatch grows when the 95 % "
           "interval of its per-seed slope over steps is above 0")
RL_KEEP = ("abs_dlogp_mean", "abs_dlogp_max", "mismatch_kl_k3", "reward", "eval_accuracy")


@dataclass(frozen=True)
class RLSizes:
    """The RL arms. Full size: the tiny MoE after its cached SFT (``on_policy_lab.policy``, a policy
    with reward to learn from), 1-digit arithmetic, the minirl engine's ``typical`` knobs in the
    arm's dtype against the trainer in the same dtype; held-out accuracy after the last step."""

    model: str = "tiny-qwen3-moe"
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 100
    prompts_per_step: int = 4
    group_size: int = 4
    max_new_tokens: int = 6
    lr: float = 1e-3  # the tiny models' RL lr elsewhere here (labs.lr0_lab, labs.on_policy_lab)
    n_eval: int = 64


RL_SMALL = RLSizes(seeds=(0, 1), steps=2, prompts_per_step=2, group_size=2, n_eval=4)


def rl_config(sizes: RLSizes, dtype: str, seed: int):  # noqa: ANN201 - a TrainConfig
    """One arm: engine and trainer both in ``dtype``, no correction (the mismatch is the measurement)."""
    from labs.on_policy_lab import policy
    from minirl.training.train_config import TrainConfig

    return TrainConfig(model=str(policy(sizes.model)), sft_steps=0, task_kwargs={"digits": 1}, n_train=64,
                       n_eval=sizes.n_eval, eval_every=sizes.steps, checkpoint_every=0, progress=False,
                       correction="none", engine=f"minirl:typical,dtype={dtype}", trainer_dtype=dtype,
                       steps=sizes.steps, prompts_per_step=sizes.prompts_per_step, group_size=sizes.group_size,
                       max_new_tokens=sizes.max_new_tokens, lr=sizes.lr, seed=seed)


@quiet_when_asked
def rl_arms(sizes: RLSizes, arms_dir: Path, split_seed: int, progress: bool = False) -> xr.Dataset:
    """Both dtypes over ``sizes.seeds`` -> ``RL_KEEP`` columns with dims (dtype, seed, step); each
    (dtype, seed) arm cached (``on_policy_lab.arm``), so a killed entry resumes."""
    from labs.on_policy_lab import arm

    keys = [(d, seed) for d in DTYPES for seed in sizes.seeds]
    logs = {k: arm(rl_config(sizes, *k), arms_dir / f"{sizes.model}_{k[0]}_seed{k[1]}.nc", split_seed, keep=RL_KEEP)
            for k in tqdm(keys, desc="fp16 / bf16 RL arms", disable=not progress)}
    seeds = pd.Index(sizes.seeds, name="seed")
    return xr.concat([xr.concat([logs[d, s] for s in sizes.seeds], seeds) for d in DTYPES],
                     pd.Index(list(DTYPES), name="dtype"))


def rl_verdict(ds: xr.Dataset) -> tuple[str, dict[str, float]]:
    """``RL_RULE`` on ``rl_arms``' dataset -> a sentence and its numbers (per dtype: the mismatch,
    its slope, the mean reward over steps and the final held-out accuracy, each with its interval)."""
    from labs.lr0_lab import slopes
    from minirl.training.plot import mean_ci

    trained = _trained(ds)
    stats = {}
    for d in DTYPES:
        arm = trained.sel(dtype=d)
        stats[d] = {"mismatch": mean_ci(arm["abs_dlogp_mean"].mean("step").to_numpy()),
                    "slope": mean_ci(slopes(arm["abs_dlogp_mean"])),
                    "reward": mean_ci(arm["reward"].mean("step").to_numpy()),
                    "accuracy": mean_ci(ds["eval_accuracy"].sel(dtype=d).isel(step=-1).to_numpy())}
    (b, b_ci), (h, h_ci) = stats["bfloat16"]["mismatch"], stats["float16"]["mismatch"]
    holds = b_ci is not None and h_ci is not None and h_ci[1] < b_ci[0] and h < 0.5 * b
    ratio = h / b if b else math.nan  # both exactly 0: no mismatch to keep down
    iv = lambda ci: "" if ci is None else f" [{ci[0]:.2g}, {ci[1]:.2g}]"  # noqa: E731
    grows = {d: stats[d]["slope"][1] is not None and stats[d]["slope"][1][0] > 0 for d in DTYPES}
    arms = "; ".join(
        f"{d}: mismatch {stats[d]['mismatch'][0]:.3g}{iv(stats[d]['mismatch'][1])}, slope "
        f"{stats[d]['slope'][0]:.2g}/step{iv(stats[d]['slope'][1])} ({'grows' if grows[d] else 'growth not shown'}), "
        f"reward {stats[d]['reward'][0]:.2f}{iv(stats[d]['reward'][1])}, held-out accuracy "
        f"{stats[d]['accuracy'][0]:.2f}{iv(stats[d]['accuracy'][1])}" for d in DTYPES)
    text = (f"RL, {ds.sizes['seed']} seeds x {trained.sizes['step']} steps: "
            f"{'fp16 keeps the mismatch down' if holds else 'fp16 keeping the mismatch down is not shown'} "
            f"(fp16/bf16 = {ratio:.2f}); {arms}")
    numbers = {"rl_holds": float(holds), "rl_ratio": ratio,
               **{f"rl_{k} {d}": float(v[0]) for d in DTYPES for k, v in stats[d].items()},
               **{f"rl_grows {d}": float(grows[d]) for d in DTYPES}}
    return text, numbers


def rl_curves(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """The (seed, step) curves of the mismatch per dtype, the entry's bands."""
    return {f"mean |Δ logprob| {d}": _trained(ds)["abs_dlogp_mean"].sel(dtype=d, drop=True) for d in DTYPES}


def _trained(ds: xr.Dataset) -> xr.Dataset:
    """The RL steps of ``rl_arms``' dataset: its last row is the held-out evaluation after the last step."""
    return ds.isel(step=slice(0, -1))
