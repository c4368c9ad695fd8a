"""Vanilla GRPO vs TIS vs IcePop under a train-inference mismatch (Ring-1T §2.3.4, Figs 6, 10-12).

Ring-1T trains with a bf16 rollout engine against its trainer and shows that without a
correction the mismatch KL and the gradient norm grow until training collapses, while IcePop
(keep a token's gradient only when rho = pi_train / pi_infer lies in [0.5, 5]) stays stable and
discards just 1-2 per mille of the tokens. Here the injected mismatch is the same kind: the minirl
engine with its ``typical`` inference knobs in bf16 samples, an fp32 transformers model trains,
on the zoo's tiny MoE after a short task SFT. Every arm runs ``minirl.train`` with the same seed
and config; only ``correction`` differs, so the curves differ only by the correction.

bf16 vs fp32 alone is a tiny gap on a tiny model (rho almost never leaves [0.5, 5]), so
``weight_noise`` injects a larger, controlled one: the rollout engine receives the trainer's
weights plus Gaussian noise of that relative size at every sync (a stand-in for the kernel,
precision and parallelism differences that make a 1T model's engines disagree).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import torch
import xarray as xr
from matplotlib.figure import Figure
from tqdm.auto import tqdm

import minirl
from labs import zoo
from minirl import Rollout, SamplingParams, tasks
from minirl.algorithms import corrections
from minirl.quiet import quiet_when_asked
from minirl.engines import RolloutEngine, build_engine
from minirl.training.sft import encode, warm_start
from minirl.training.trainer import pack, resolve_model
from minirl.training.trainer_forward import forward

PAPER_MASKED_PERMILLE = (1.0, 2.0)  # Ring-1T §2.3.4 / Fig. 12: IcePop keeps 1-2 per mille of tokens clipped
ARMS = {"GRPO": "none", "TIS": "tis", "IcePop": "icepop"}  # arm label -> TrainConfig.correction
CURVES = {"reward": ("reward", "mean reward per sample"), "grad_norm": ("gradient norm", "L2 norm (before clipping)"),
          "mismatch_kl_k3": ("mismatch KL (k3)", "KL(pi_infer || pi_train), nats"),
          "frac_masked": ("masked / clipped-to-0 fraction", "share of response tokens")}
COLORS = {"GRPO": "#c0392b", "TIS": "#f39c12", "IcePop": "#2c7fb8"}


class NoisyEngine:
    """A rollout engine that is sent the trainer's weights plus relative Gaussian noise: an
    explicit, tunable train-inference mismatch (0 = the engine's own bf16/knob mismatch only)."""

    def __init__(self, inner: RolloutEngine, noise: float, seed: int = 0) -> None:
        self.inner, self.noise, self.gen = inner, noise, torch.Generator().manual_seed(seed)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        return self.inner.generate(prompts, params)

    def load_weights(self, model: torch.nn.Module) -> None:
        sd = {k: v.detach() + self.noise * v.detach().float().std() * torch.randn(v.shape, generator=self.gen)
              if v.is_floating_point() and v.dim() == 2 and self.noise > 0 else v.detach()
              for k, v in model.state_dict().items()}
        self.inner.load_weights(sd)


@quiet_when_asked
def train_arms(steps: int = 20, prompts_per_step: int = 8, group_size: int = 8, max_new_tokens: int = 8,
               sft_steps: int = 100, engine: str = "minirl:typical", engine_dtype: str = "bfloat16",
               weight_noise: float = 0.15, model: str = "tiny-qwen3-moe", seed: int = 0, lr: float = 1e-3,
               out_dir: str | None = None, progress: bool = True) -> xr.Dataset:
    """One ``minirl.train`` run per arm; returns every logged metric as [arm, step] variables.

    A higher lr than the default makes a few steps show movement; it also makes the uncorrected
    arm's instability (what Ring-1T Fig. 6 shows over thousands of steps) visible sooner."""
    path = str(zoo.build(model, seed=0))
    root = Path(out_dir or tempfile.mkdtemp(prefix="icepop_lab_"))
    frames = []
    for arm, correction in tqdm(ARMS.items(), desc="arms", disable=not progress):
        cfg = minirl.TrainConfig(model=path, sft_steps=sft_steps, task="arithmetic", task_kwargs={"digits": 1},
                                 n_train=64, n_eval=8, prompts_per_step=prompts_per_step, group_size=group_size,
                                 max_new_tokens=max_new_tokens, steps=steps, eval_every=0, checkpoint_every=0,
                                 engine=engine, engine_dtype=engine_dtype, correction=correction, lr=lr, seed=seed,
                                 out_dir=str(root / arm), progress=False)
        rollout = build_engine(engine, resolve_model(cfg), engine_dtype, rollouts=True)
        if weight_noise > 0:  # the trainer starts from the same checkpoint: perturb before step 0 too
            rollout = NoisyEngine(rollout, weight_noise, seed)
            rollout.load_weights(_hf(resolve_model(cfg)))
        rows = minirl.train(cfg, engine=rollout).rows
        frames.append(pd.DataFrame(rows).assign(arm=arm, step=range(len(rows))))
    ds = xr.Dataset.from_dataframe(pd.concat(frames).set_index(["arm", "step"]))
    ds = ds.reindex(arm=list(ARMS))
    ds.attrs = {"weight_noise": weight_noise, "engine": engine, "engine_dtype": engine_dtype, "trainer_dtype": "float32", "model": model,
                "steps": steps, "batch": prompts_per_step * group_size, "lr": lr,
                "out_dir": str(root)}  # one minirl run directory per arm, for `mlab plot`
    return ds


def _hf(path: Path) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def summary(ds: xr.Dataset) -> pd.DataFrame:
    """Per arm: mean reward over the first and last quarter, max grad norm, mean mismatch KL, and
    the share of tokens whose weight was 0 (per mille), next to the paper's 1-2 per mille."""
    q = max(1, ds.sizes["step"] // 4)
    out = pd.DataFrame({
        "reward_first": ds["reward"].isel(step=slice(0, q)).mean("step").to_series(),
        "reward_last": ds["reward"].isel(step=slice(-q, None)).mean("step").to_series(),
        "grad_norm_max": ds["grad_norm"].max("step").to_series(),
        "mismatch_kl_k3": ds["mismatch_kl_k3"].mean("step").to_series(),
        "masked_permille": 1000 * ds["frac_masked"].mean("step").to_series(),
    })
    return out.loc[list(ARMS)]


def figure(ds: xr.Dataset) -> Figure:
    """Reward, grad norm, mismatch KL and masked fraction per step, one line per arm."""
    fig = Figure(figsize=(14, 3.4), layout="constrained")
    for ax, (var, (title, ylabel)) in zip(fig.subplots(1, len(CURVES)), CURVES.items()):
        for arm in ds["arm"].values:
            ax.plot(ds["step"], ds[var].sel(arm=arm), marker=".", color=COLORS[str(arm)], label=str(arm))
        ax.set(xlabel="RL step", ylabel=ylabel, title=title)
    lo, hi = PAPER_MASKED_PERMILLE
    ax.axhspan(lo / 1000, hi / 1000, color="#2c7fb8", alpha=0.15, label="Ring-1T IcePop: 1-2‰")
    ax.legend(fontsize=8)
    fig.suptitle(f"{ds.attrs['engine']} {ds.attrs['engine_dtype']} rollouts vs fp32 trainer, {ds.attrs['model']}")
    return fig


def masked_share_sweep(noises: tuple[float, ...] = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5), prompts: int = 64, n: int = 32,
                       max_new_tokens: int = 8, engine: str = "minirl:typical", engine_dtype: str = "bfloat16",
                       sft_steps: int = 100, model: str = "tiny-qwen3-moe", seed: int = 0) -> pd.DataFrame:
    """No training: for each ``weight_noise``, sample rollouts with the noisy engine, score them
    with the fp32 trainer and apply IcePop and TIS. Many more tokens than a few training steps,
    so a per-mille share is resolved; shows which mismatch size gives the paper's 1-2 per mille."""
    path = warm_start(zoo.build(model, seed=0), "arithmetic", {"digits": 1}, steps=sft_steps, seed=seed, progress=False)
    hf = _hf(path).eval()
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    problems, _ = tasks.splits(tasks.get("arithmetic", digits=1), prompts, 1, seed)
    batch = [encode(tok, p.prompt)[0] for p in problems]  # the training runs' prompts
    rows = []
    for noise in noises:
        rollout = NoisyEngine(build_engine(engine, path, engine_dtype, rollouts=True), noise, seed)
        rollout.load_weights(hf)
        b = pack(rollout.generate(batch, SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=seed)))
        with torch.no_grad():
            logp = forward(hf, b.sequences).logp * b.mask
        _, _, ice = corrections.icepop(logp, b.logp_infer, b.mask)
        _, _, tis = corrections.tis(logp, b.logp_infer, b.mask)
        rows.append({"weight_noise": noise, "tokens": int(b.mask.sum()), "mismatch_kl_k3": ice["mismatch_kl_k3"],
                     "abs_dlogp_mean": ice["abs_dlogp_mean"], "icepop_masked_permille": 1000 * ice["frac_masked"],
                     "tis_capped_permille": 1000 * tis["frac_clipped_high"]})
    return pd.DataFrame(rows).set_index("weight_noise")


def sweep_figure(sweep: pd.DataFrame) -> Figure:
    """IcePop's masked share (and TIS's capped share) against the mismatch KL, paper band shaded."""
    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    kl = sweep["mismatch_kl_k3"].clip(lower=1e-7)
    ax.plot(kl, sweep["icepop_masked_permille"], marker="o", color=COLORS["IcePop"], label="IcePop: masked (rho outside [0.5, 5])")
    ax.plot(kl, sweep["tis_capped_permille"], marker="s", color=COLORS["TIS"], label="TIS: capped (rho > 2)")
    for i, (noise, x, y) in enumerate(zip(sweep.index, kl, sweep["icepop_masked_permille"])):
        ax.annotate(f"{noise:g}", (x, y), textcoords="offset points", xytext=(3, 4 if i % 2 else -10), fontsize=7)
    ax.axhspan(*PAPER_MASKED_PERMILLE, color=COLORS["IcePop"], alpha=0.15, label="Ring-1T: 1-2‰")
    grows = sweep["icepop_masked_permille"].iloc[-1] > sweep["icepop_masked_permille"].iloc[0]
    ax.set(xscale="log", xlabel="mismatch KL (k3), labels: weight_noise", ylabel="‰ of tokens",
           title="masked share " + ("grows with" if grows else "does not grow with") + " the mismatch")
    ax.legend(fontsize=8)
    return fig


def monitor_reading(log: xr.Dataset) -> str:
    """Notebook 04 §4: where one run's first divergence sat at each reading and its routing flips, in
    measured values with their terms explained (the monitor's own sentence reads a fitted line, which
    printed "2.3e-16 %" for a flat 0, and "moved to none" without saying none means within noise)."""
    steps = [int(s) for s in log["monitor_step"].values]
    where = [str(v) or "none" for v in log["monitor_first_divergence"].values]
    spans = []
    for site in dict.fromkeys(where):
        at = [s for s, w in zip(steps, where) if w == site]
        label = ("no site (every site's error within its float64 noise floor)" if site == "none" else f"`{site}`")
        spans.append(f"{label} at step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}")
    flips = 100 * log["monitor_routing_flips"].mean("layer").values
    return (f"The first divergence (the first site whose error leaves its float64 noise floor) was {'; '.join(spans)}. "
            f"Routing flips (probe tokens whose top-k expert set differs, mean over layers) went from "
            f"{_percent(flips[0])} at step {steps[0]} to {_percent(flips[-1])} at step {steps[-1]}.")


def _percent(value: float) -> str:
    """A measured share in %: an exact 0 reads "0 %", never a float's rounding residue."""
    return "0 %" if value == 0 else f"{value:.2g} %"
