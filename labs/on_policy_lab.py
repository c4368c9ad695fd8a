"""Is there a setting where the trainer's recomputed log-probs equal the rollout engine's, bit for bit?

Why: with ``pi_train == pi_infer`` exactly, the importance ratio is 1 and every correction (TIS,
IcePop, MIS) is a no-op: RL is on-policy by construction, not by approximation. Ring-linear §5.2.1
aligns the engine to the trainer module by module; ``Knobs.hf_exact()`` is that alignment for a
stock transformers trainer, and the checklist entry reaches exactly 0 on a teacher-forced prefill.
An RL step is more than a prefill: the engine decodes token by token against its KV cache (other
GEMM shapes), the trainer scores a padded batch through the fused chunked log-prob head
(``logsumexp`` then subtract, where the engine takes ``log_softmax``), and after each update the
engine serves weights the sync rounded while the trainer computes in its own copy. Here each
``Setting`` runs real RL steps (``minirl`` ``Trainer``) and reads the step's max and mean
|Δ logprob| on the sampled tokens (``corrections.mismatch_metrics``) and its rollout time.

Verdict rule, fixed before the runs (``RULE``): a setting is on-policy bitwise when its max
|Δ logprob| is exactly 0 at every step of every seed. Batch invariance is measured beside it: the
distinct greedy completions of one prompt decoded at batch sizes 1..64, ``batch_invariant`` on and off.

Each (model, setting, seed) run is an arm cached as ``<arms>/<model>_<setting>_seed<s>.nc``: a
killed entry resumes at the first arm not written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from minirl.quiet import quiet_when_asked

RULE = "on-policy bitwise: max |Δ logprob| == 0 at every step of every seed"
KEEP = ("abs_dlogp_max", "abs_dlogp_mean", "mismatch_kl_k3", "time_rollout")  # the per-step columns an arm keeps


@dataclass(frozen=True)
class Setting:
    """Engine spec and trainer numerics of one arm (``TrainConfig`` fields)."""

    engine: str
    trainer_dtype: str
    trainer_attention: str
    trainer_forward: str = "batched"


SETTINGS = {
    # the README's claim: hf_exact knobs in bf16 against a bf16 trainer, the trainer's attention left as sdpa
    "hf_exact_bf16_sdpa": Setting("minirl:hf_exact,dtype=bfloat16", "bfloat16", "sdpa"),
    # the same with the trainer's attention as the engine's (eager: fp32 softmax between two GEMMs)
    "hf_exact_bf16_eager": Setting("minirl:hf_exact,dtype=bfloat16", "bfloat16", "eager"),
    # both sides in fp32, transformers' eager math on the engine (Ring-linear §5.2.1 aligned)
    "hf_exact_fp32_eager": Setting("minirl:hf_exact,dtype=float32", "float32", "eager"),
    # the engine re-runs each prefix (no KV cache) and the trainer scores each token from its prefix the same way:
    # every shape and the log-softmax the engine's (TrainConfig.trainer_forward: per_token)
    "per_token_bf16": Setting("minirl:hf_exact,dtype=bfloat16,decode=recompute", "bfloat16", "eager", "per_token"),
    # what RL runs by default: vLLM-like bf16 knobs against the fp32 trainer (the cost baseline)
    "typical_bf16": Setting("minirl:typical,dtype=bfloat16", "float32", "auto"),
}


@dataclass(frozen=True)
class Sizes:
    """One arm's RL run; the defaults are the full size (tiny models, a few steps: the question is
    whether a single bit moves, which the first steps after an update already answer)."""

    models: tuple[str, ...] = ("tiny-qwen3", "tiny-qwen3-moe")  # dense, and the MoE with its routing
    settings: tuple[str, ...] = tuple(SETTINGS)
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 4
    prompts_per_step: int = 4
    group_size: int = 4
    max_new_tokens: int = 12
    lr: float = 1e-3  # large for the tiny models, so every step moves the weights the sync must carry
    batch_sizes: tuple[int, ...] = tuple(range(1, 65))
    greedy_tokens: int = 16


SMALL = Sizes(models=("tiny-qwen3",), settings=("per_token_bf16",), seeds=(0, 1),
              steps=1, prompts_per_step=2, group_size=2, max_new_tokens=6, batch_sizes=(1, 3, 8), greedy_tokens=8)


def policy(model: str) -> Path:
    """The zoo model after its 100-step arithmetic SFT with seed 0 (cached): a policy that earns
    some reward, so RL steps update the weights (from the raw model every group scores 0, every
    advantage is 0 and no weight moves); every seed of every arm starts from this one checkpoint."""
    from labs import zoo
    from minirl.training.sft import warm_start

    return warm_start(zoo.build(model), "arithmetic", {"digits": 1}, steps=100, seed=0, progress=False)


def config(model: str, setting: Setting, sizes: Sizes, **changes: object):  # noqa: ANN201 - a TrainConfig
    """The RL run of one arm: 1-digit arithmetic from ``policy(model)``, no correction (it would not
    change the log-probs compared)."""
    from minirl.training.train_config import TrainConfig

    return TrainConfig(model=str(policy(model)), sft_steps=0, task_kwargs={"digits": 1}, n_train=64, n_eval=0,
                       eval_every=0, checkpoint_every=0, progress=False, correction="none", steps=sizes.steps,
                       prompts_per_step=sizes.prompts_per_step, group_size=sizes.group_size,
                       max_new_tokens=sizes.max_new_tokens, lr=sizes.lr, engine=setting.engine,
                       trainer_dtype=setting.trainer_dtype, trainer_attention=setting.trainer_attention,
                       trainer_forward=setting.trainer_forward, **changes)


def arm(cfg, cache: Path, split_seed: int, prepare: Callable | None = None,  # noqa: ANN001 - a TrainConfig
        keep: tuple[str, ...] = KEEP) -> xr.Dataset:
    """One seed's run of ``cfg`` -> its ``keep`` columns by step (``cached`` at ``cache`` under the recipe
    ``cfg``, ``prepare`` and ``keep``). ``prepare(trainer)`` runs on the built ``Trainer`` before its first
    step (``labs.lr0_lab`` sets the lr to 0 there); ``split_seed``: the train / held-out split every seed
    shares (``labs.reproduce.SPLIT_SEED``)."""
    recipe = {**cfg.to_dict(), "out_dir": None, "prepare": getattr(prepare, "__name__", None)}
    if keep != KEEP:  # the recipes of arms written before ``keep`` existed stay valid
        recipe["keep"] = list(keep)
    return cached(cache, json.dumps(recipe, sort_keys=True), lambda: _train(cfg, split_seed, prepare, keep))


def _train(cfg, split_seed: int, prepare: Callable | None, keep: tuple[str, ...]) -> xr.Dataset:  # noqa: ANN001
    from minirl import tasks
    from minirl.training import run_log
    from minirl.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(dataclasses.replace(cfg, out_dir=out))
        trainer.train_set = tasks.splits(trainer.task, cfg.n_train, cfg.n_eval, split_seed)[0]  # every seed, one set
        if prepare is not None:
            prepare(trainer)
        log = run_log.to_dataset(trainer.run().rows).swap_dims(row="step")
    return log[[k for k in keep if k in log]].drop_vars([c for c in log.coords if c != "step"])


def cached(cache: Path, recipe: str, compute: Callable[[], xr.Dataset]) -> xr.Dataset:
    """The arm at ``cache`` when an earlier run of the same ``recipe`` wrote it (resumable entries), else
    ``compute()``, written there whole: an arm of other sizes or settings is measured again, not reused,
    and a kill mid-write leaves no half file (a sibling temporary renamed over ``cache``)."""
    if cache.is_file():
        ds = xr.load_dataset(cache, engine="h5netcdf")
        if ds.attrs.get("recipe") == recipe:
            return ds
    ds = compute()
    ds.attrs = {**ds.attrs, "recipe": recipe}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.tmp")
    ds.to_netcdf(tmp, engine="h5netcdf")
    os.replace(tmp, cache)
    return ds


@quiet_when_asked
def measure(sizes: Sizes, arms_dir: Path, split_seed: int, progress: bool = False) -> xr.Dataset:
    """Every (model, setting, seed) arm -> ``KEEP`` variables with dims (model, setting, seed, step)."""
    from tqdm.auto import tqdm

    keys = [(m, s, seed) for m in sizes.models for s in sizes.settings for seed in sizes.seeds]
    logs = {k: arm(config(k[0], SETTINGS[k[1]], sizes, seed=k[2]), arms_dir / f"{k[0]}_{k[1]}_seed{k[2]}.nc", split_seed)
            for k in tqdm(keys, desc="on-policy arms", disable=not progress)}
    seeds = pd.Index(sizes.seeds, name="seed")
    per_setting = lambda m: xr.concat([xr.concat([logs[m, s, seed] for seed in sizes.seeds], seeds)  # noqa: E731
                                       for s in sizes.settings], pd.Index(list(sizes.settings), name="setting"))
    return xr.concat([per_setting(m) for m in sizes.models], pd.Index(list(sizes.models), name="model"))


def verdict(ds: xr.Dataset) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per (model, setting): ``RULE`` (``bitwise``), the steps at exactly 0, the mean of the
    per-seed max |Δ| and mean |Δ| with their 95 % intervals over seeds, and the rollout time per
    step relative to ``typical_bf16`` in the same run (when it ran)."""
    from minirl.training.plot import mean_ci

    rows = []
    for model in ds["model"].values:
        for setting in ds["setting"].values:
            d = ds.sel(model=model, setting=setting)
            worst = d["abs_dlogp_max"].max("step").values  # per seed: its largest step max
            (mx, mx_ci), (mn, mn_ci) = mean_ci(worst), mean_ci(d["abs_dlogp_mean"].mean("step").values)
            rows.append({"model": str(model), "setting": str(setting), "bitwise": bool((d["abs_dlogp_max"] == 0).all()),
                         "zero_steps": int((d["abs_dlogp_max"] == 0).sum()), "steps": int(d["abs_dlogp_max"].size),
                         "max_dlogp": mx, "max_ci": mx_ci, "mean_dlogp": mn, "mean_ci": mn_ci,
                         "rollout_s": float(d["time_rollout"].mean())})
    table = pd.DataFrame(rows).set_index(["model", "setting"])
    if "typical_bf16" in ds["setting"].values:
        typical = table["rollout_s"].xs("typical_bf16", level="setting")
        per_row = typical.reindex(table.index.get_level_values("model")).to_numpy()
        table["rollout_vs_typical"] = table["rollout_s"] / per_row
    numbers = {f"{k} {m} {s}": float(v) for (m, s), row in table.iterrows() for k, v in row.items()
               if k in ("bitwise", "zero_steps", "max_dlogp", "mean_dlogp", "rollout_vs_typical")}
    return table, numbers


def sentence(table: pd.DataFrame, invariance: pd.DataFrame) -> str:
    """The outcome's text: which settings hold ``RULE``, the closest otherwise, and the batch test."""
    iv = lambda ci: "" if ci is None else f" [{ci[0]:.2g}, {ci[1]:.2g}]"  # noqa: E731
    held = [f"{m} {s}" for (m, s), r in table.iterrows() if r["bitwise"]]
    cost = lambda r: (f", rollout {r['rollout_vs_typical']:.2f}x typical"  # noqa: E731
                      if "rollout_vs_typical" in r else "")
    parts = [f"{m} {s}: max |Δ| {r['max_dlogp']:.2g}{iv(r['max_ci'])}, mean {r['mean_dlogp']:.2g}{iv(r['mean_ci'])}, "
             f"{r['zero_steps']}/{r['steps']} steps at 0{cost(r)}" for (m, s), r in table.iterrows()]
    head = (f"{RULE}: holds for {', '.join(held)}" if held else f"{RULE}: no setting holds") + "; "
    inv = "; ".join(f"batch_invariant={k}: {v} distinct greedy completion(s) over batch sizes "
                    f"{invariance.attrs['batch_sizes']}" for k, v in invariance["distinct"].items())
    return head + "; ".join(parts) + "; " + inv


def batch_invariance(model: str, sizes: Sizes, spec: str = "minirl:typical,dtype=bfloat16") -> pd.DataFrame:
    """One prompt decoded greedily among ``b - 1`` other prompts for each ``b`` in ``sizes.batch_sizes``,
    ``batch_invariant`` off and on -> distinct completions of that prompt per setting (1 = invariant)."""
    from aligntools.gates.inputs import prepare_tokens
    from labs import zoo
    from minirl.engine.sampling import SamplingParams
    from minirl.engines import build_engine

    path = zoo.build(model)
    ids = prepare_tokens(Path(path), 16 * max(sizes.batch_sizes), n_seqs=max(sizes.batch_sizes)).tolist()
    params = SamplingParams(temperature=0.0, max_new_tokens=sizes.greedy_tokens, ignore_eos=True)
    out = {}
    for flag in (False, True):
        engine = build_engine(f"{spec},batch_invariant={str(flag).lower()}", path, rollouts=True)
        seen = {tuple(engine.generate(ids[:b], params)[0].token_ids) for b in sizes.batch_sizes}
        out[flag] = len(seen)
    table = pd.DataFrame({"distinct": out}).rename_axis("batch_invariant")
    table.attrs["batch_sizes"] = f"{min(sizes.batch_sizes)}..{max(sizes.batch_sizes)} ({len(sizes.batch_sizes)} sizes)"
    return table


def figure(ds: xr.Dataset) -> "Figure":
    """Per model: each setting's per-step max |Δ logprob| (mean over seeds; 0 drawn at the floor)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * ds.sizes["model"], 3.4))
    for ax, model in zip(fig.subplots(1, ds.sizes["model"], squeeze=False)[0], ds["model"].values):
        for setting in ds["setting"].values:
            y = ds["abs_dlogp_max"].sel(model=model, setting=setting).mean("seed").to_numpy()
            ax.plot(ds["step"].values, np.maximum(y, 1e-10), marker="o", label=str(setting))
        ax.set(yscale="log", xlabel="RL step", ylabel="max |Δ logprob| (1e-10 = exactly 0)", title=str(model))
        ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig
