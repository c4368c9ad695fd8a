"""Does the train-inference mismatch grow because training moves the weights? The same seeds at lr = 0.

Why: Ring-1T §2.3.4 reports that the mismatch compounds as RL goes on. Two causes would look
alike: the updates drive the policy where the two engines disagree more (sharper distributions,
larger activations), or the samples just change from step to step. At lr = 0 the weights never
move, so the engine and the trainer hold the step-0 policy and only the samples change: a flat
mean |Δ logprob| there and a rising one at the normal lr puts the growth on the updates. The
``TrainConfig`` refuses ``lr: 0`` (an RL run that cannot learn is a typo there), so the lab builds
the ``Trainer`` at the normal lr and sets its AdamW groups' lr to 0 before the first step: AdamW
with lr 0 (and no weight decay) leaves every weight bit unchanged.

Verdict rule, fixed before the runs (``RULE``): per seed, the least-squares slope of the step's
mean |Δ logprob| over steps; lr = 0 "stays flat" when the 95 % interval of the slope over seeds
contains 0, and the normal lr "grows" when its interval is above 0.

Each (lr, seed) arm is cached (``labs.on_policy_lab.arm``): a killed entry resumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

RULE = ("per seed the least-squares slope of mean |Δ logprob| over steps; lr = 0 stays flat when the slope's 95 % "
        "interval over seeds contains 0, the normal lr grows when it is above 0")


@dataclass(frozen=True)
class Sizes:
    """The full size: the tiny MoE after its cached SFT (``on_policy_lab.policy``: a policy RL
    updates), bf16 typical rollouts against the fp32 trainer (the README's basic mismatch)."""

    model: str = "tiny-qwen3-moe"
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 12
    prompts_per_step: int = 4
    group_size: int = 4
    max_new_tokens: int = 6
    lr: float = 1e-3  # the tiny models' RL lr elsewhere here (collapse_lab.SMALL, the mismatch_growth entry)


SMALL = Sizes(seeds=(0, 1), steps=3, prompts_per_step=2, group_size=2)


def config(sizes: Sizes, seed: int):  # noqa: ANN201 - a TrainConfig
    from labs.on_policy_lab import policy
    from minirl.training.train_config import TrainConfig

    return TrainConfig(model=str(policy(sizes.model)), sft_steps=0, task_kwargs={"digits": 1}, n_train=64,
                       n_eval=0, eval_every=0, checkpoint_every=0, progress=False, correction="none",
                       engine="minirl:typical,dtype=bfloat16", steps=sizes.steps,
                       prompts_per_step=sizes.prompts_per_step, group_size=sizes.group_size,
                       max_new_tokens=sizes.max_new_tokens, lr=sizes.lr, seed=seed)


def freeze(trainer) -> None:  # noqa: ANN001 - a Trainer
    """lr = 0 on every AdamW group: the weights keep every bit (module docstring)."""
    for group in trainer.opt.param_groups:
        group["lr"] = 0.0


def measure(sizes: Sizes, arms_dir: Path, split_seed: int) -> xr.Dataset:
    """Both lrs over ``sizes.seeds`` -> the arms' per-step columns with dims (lr, seed, step)."""
    from labs.on_policy_lab import arm

    arms = {name: [arm(config(sizes, seed), arms_dir / f"{name}_seed{seed}.nc", split_seed,
                       freeze if name == "lr0" else None)
                   for seed in sizes.seeds] for name in ("lr0", "normal")}
    return xr.concat([xr.concat(v, pd.Index(sizes.seeds, name="seed")) for v in arms.values()],
                     pd.Index(list(arms), name="lr"))


def slopes(curve: xr.DataArray) -> np.ndarray:
    """Per seed, the least-squares slope of a (seed, step) curve over steps (nats per step)."""
    steps = curve["step"].to_numpy().astype(float)
    return np.array([np.polyfit(steps, row, 1)[0] for row in curve.transpose("seed", "step").to_numpy()])


def verdict(ds: xr.Dataset) -> tuple[str, dict[str, float]]:
    """``RULE`` on ``ds["abs_dlogp_mean"]`` (dims lr, seed, step) -> a sentence and its numbers."""
    from minirl.training.plot import mean_ci

    stats = {lr: mean_ci(slopes(ds["abs_dlogp_mean"].sel(lr=lr))) for lr in ("lr0", "normal")}
    (s0, ci0), (s1, ci1) = stats["lr0"], stats["normal"]
    flat = ci0 is not None and ci0[0] <= 0 <= ci0[1]
    grows = ci1 is not None and ci1[0] > 0
    first = {lr: float(ds["abs_dlogp_mean"].sel(lr=lr).isel(step=0).mean()) for lr in ("lr0", "normal")}
    last = {lr: float(ds["abs_dlogp_mean"].sel(lr=lr).isel(step=-1).mean()) for lr in ("lr0", "normal")}
    iv = lambda ci: "" if ci is None else f" [{ci[0]:.2g}, {ci[1]:.2g}]"  # noqa: E731
    text = (f"slope of mean |Δ logprob| per step over {ds.sizes['seed']} seeds: lr = 0 {s0:.2g}{iv(ci0)} "
            f"({first['lr0']:.3g} -> {last['lr0']:.3g}): {'flat' if flat else 'not flat'}; normal lr {s1:.2g}{iv(ci1)} "
            f"({first['normal']:.3g} -> {last['normal']:.3g}): {'grows' if grows else 'growth not shown'}")
    return text, {"slope_lr0": s0, "slope_normal": s1, "flat_lr0": float(flat), "grows_normal": float(grows),
                  "first_lr0": first["lr0"], "last_lr0": last["lr0"], "first_normal": first["normal"],
                  "last_normal": last["normal"]}


def seeded(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """The (seed, step) curves the entry's bands are made of."""
    return {f"abs_dlogp_mean {lr}": ds["abs_dlogp_mean"].sel(lr=lr, drop=True) for lr in ds["lr"].values}
