"""The ``gpu_rl`` stage: RL on one card, GRPO against GRPO + IcePop + R3, each arm a full
``Trainer`` run whose rollout engine (minirl, bf16) and trainer (fp32) share the device.

Why two arms in one stage: the lab's claim is that correcting the rollout/trainer mismatch
changes what RL learns, and a card is where a hundred steps per arm take seconds rather than an
hour. Both arms start from the same SFT-warmed checkpoint (``rl_checkpoint``: without the
warm-up every reward of an untrained model is 0, so every advantage and every loss is exactly 0,
as the first card run's trainer stage showed) with the same seed; the stage reports per step the
reward, loss, grad norm, IcePop mask, router flips and the time split, plots them, and says in
one computed sentence whether the arms' final rewards differ beyond the steps' own spread.

Routing flips: after each rollout the trainer's model (the engine's weights: the sync just ran)
routes the same tokens, and the share of (token, MoE layer) pairs whose top-k expert set differs
from the engine's is the flip rate R3 exists to remove from the update. That probe forward is
timed and taken out of the rollout time.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.runner import REPO, Recorder

#: The per-step series plotted for each arm (the CSV has these, the time split and ``nan_skipped``).
SERIES = ("reward", "loss", "grad_norm", "icepop_mask_permille", "routing_flips", "abs_dlogp_mean")
TIME_SPLIT = {"rollout": "time_rollout", "logprobs": "time_old_logprobs", "update": "time_update",
              "sync": "time_sync"}


def zoo_root() -> Path:
    """The zoo cache the check reads and fills (the carried one on the card)."""
    return Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))


def rl_checkpoint(root: Path, spec: dict) -> Path:
    """The SFT-warmed checkpoint both arms start from, built under ``root`` when missing.

    Its name hashes the warm-up recipe and not the base weights, so ``make gpu-wheels`` can
    carry it alone (the base model stays behind: the pair would not fit in 64 MiB)."""
    from labs import zoo
    from minirl.training.sft import warm_start

    recipe = json.dumps([spec["task"], spec["task_kwargs"], spec["sft_steps"]], sort_keys=True)
    target = root / f"{spec['model']}-seed0-sft-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"
    if (target / "sft.json").is_file():
        return target
    with torch.inference_mode(False), torch.enable_grad():
        base = zoo.build(spec["model"], out=root / f"{spec['model']}-seed0", progress=False)
        return warm_start(base, spec["task"], spec["task_kwargs"], steps=spec["sft_steps"], seed=0, out=target,
                          progress=False)


class FlipProbe:
    """The trainer's rollout engine, plus the routing-flip probe after each ``generate``."""

    def __init__(self, engine, model: torch.nn.Module) -> None:  # noqa: ANN001 - any RolloutEngine
        self.engine, self.model = engine, model
        self.returns_routed_experts = getattr(engine, "returns_routed_experts", True)
        self.flips: list[float] = []
        self.probe_s: list[float] = []

    def generate(self, prompts, params):  # noqa: ANN001, ANN201 - the RolloutEngine protocol
        from minirl.training.trainer_forward import forward

        rollouts = self.engine.generate(prompts, params)
        t0 = time.perf_counter()
        with torch.no_grad():
            mine = forward(self.model, [r.prompt_ids + r.token_ids for r in rollouts], record_routing=True).routing
        theirs = [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts]
        self.flips.append(routing_flips(mine, theirs))
        self.probe_s.append(time.perf_counter() - t0)
        return rollouts

    def load_weights(self, model: torch.nn.Module) -> None:
        self.engine.load_weights(model)


def routing_flips(mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    """Share of (token, MoE layer) pairs whose top-k expert *sets* differ ([len, layers, k] each)."""
    flipped = total = 0
    for a, b in zip(mine, theirs):
        differ = (a.sort(-1).values != b.to(a.device).sort(-1).values).any(-1)  # [len, layers]
        flipped, total = flipped + int(differ.sum()), total + differ.numel()
    return flipped / total


@contextlib.contextmanager
def counted_logprobs(calls: Counter) -> Iterator[None]:
    """Count the calls of every ``logprobs`` implementation as ``variant/impl`` (the registry's
    entries swapped for counting wrappers, and back): which one the device dispatched to."""
    import kernels

    originals = {(v, i): kernels.get("logprobs", v, impl=i)
                 for v in kernels.variants("logprobs") for i in kernels.impls("logprobs", v)}
    for (variant, impl), fn in originals.items():
        kernels.register("logprobs", variant, impl)(_counted(fn, f"{variant}/{impl}", calls))
    try:
        yield
    finally:
        for (variant, impl), fn in originals.items():
            kernels.register("logprobs", variant, impl)(fn)


def _counted(fn: Callable, label: str, calls: Counter) -> Callable:
    def counting(*args, **kwargs):
        calls[label] += 1
        return fn(*args, **kwargs)

    counting.__doc__ = fn.__doc__  # the registry insists on a docstring
    return counting


def gpu_rl(plan: Plan, rec: Recorder) -> None:
    """Both arms, step by step in turn (a run cut short still compares them at equal steps) until
    ``steps`` or ``seconds``; then the checks: finite losses, a learning signal (non-zero
    gradients), trainer and engine on the device, every trainer logprob through the device's
    implementation (Triton on CUDA)."""
    from minirl.training.run_log import RunLog
    from minirl.training.trainer import resolve_device

    spec = plan.gpu_rl
    device = resolve_device(spec["config"]["device"])
    want = "triton" if device.type == "cuda" else "torch"
    t0 = time.perf_counter()
    model = rl_checkpoint(zoo_root(), spec)
    rec.put("warm start s", time.perf_counter() - t0)
    calls: Counter[str] = Counter()
    steps: dict[str, list[dict]] = {arm: [] for arm in spec["arms"]}
    logs = {arm: RunLog(rec.file(f"gpu_rl_{_slug(arm)}.nc")) for arm in spec["arms"]}  # every metric, per step
    with counted_logprobs(calls), tempfile.TemporaryDirectory() as tmp:
        arms = {arm: _trainer(arm, {**spec["config"], **changes, "model": str(model), "out_dir": f"{tmp}/{arm}"},
                              device, rec) for arm, changes in spec["arms"].items()}
        t0 = time.perf_counter()
        for step in range(spec["config"]["steps"]):
            if time.perf_counter() - t0 > spec["seconds"]:
                break
            for arm, (trainer, probe) in arms.items():
                metrics = trainer.train_step(step)
                logs[arm].append(step, metrics)
                steps[arm].append(_row(step, metrics, probe))
        seconds = time.perf_counter() - t0
    n = len(steps[next(iter(steps))])
    rec.put("steps per arm", n)
    rec.put("arms s", seconds)
    rec.put(f"goal {spec['config']['steps']} steps per arm in {spec['seconds']:.0f} s",
            "met" if n == spec["config"]["steps"] else "missed")
    rec.put("logprob calls", ", ".join(f"{v}={n}" for v, n in sorted(calls.items())))
    for arm, rows in steps.items():
        _summary(arm, rows, rec)
    _write_steps(steps, rec.file("gpu_rl_steps.csv"))
    _plot(steps, rec.file("gpu_rl.png"))
    rec.put("verdict", verdict(steps, spec["window"]))
    for arm, rows in steps.items():
        if not all(math.isfinite(row["loss"]) and not row["nan_skipped"] for row in rows):
            raise AssertionError(f"{arm}: a loss was not finite: {[row['loss'] for row in rows]}")
        if sum(row["grad_norm"] > 0 for row in rows) * 2 < len(rows):
            raise AssertionError(f"{arm}: no gradient in most steps (every group rewarded alike); raise group_size, "
                                 f"the temperature or the SFT warm-up")
    if not calls or any(not label.endswith(f"/{want}") for label in calls):
        raise AssertionError(f"the trainer's logprobs should all run the {want} implementation; calls: {dict(calls)}")


def _trainer(arm: str, config: dict, device: torch.device, rec: Recorder):  # noqa: ANN202
    """The arm's ``Trainer`` (its engine built on the trainer's device) with the flip probe."""
    from minirl.training.train_config import TrainConfig
    from minirl.training.trainer import Trainer

    trainer = Trainer(TrainConfig.from_dict(config))
    rec.put(f"{arm} devices", f"trainer {device}, engine {trainer.engine.device}")
    if trainer.engine.device.type != device.type or next(trainer.model.parameters()).device.type != device.type:
        raise AssertionError(f"{arm}: trainer and rollout engine should share {device}; engine on "
                             f"{trainer.engine.device}")
    probe = trainer.engine = FlipProbe(trainer.engine, trainer.model)
    return trainer, probe


def _slug(arm: str) -> str:
    """An arm's name as a file name part (``grpo+icepop+r3`` -> ``grpo_icepop_r3``)."""
    return "".join(c if c.isalnum() else "_" for c in arm)


def _row(step: int, metrics: dict, probe: FlipProbe) -> dict:
    """One step's series from the trainer's metrics and the probe's flips."""
    times = {part: metrics[key] for part, key in TIME_SPLIT.items()}
    times["rollout"] -= probe.probe_s[-1]  # the flip probe is the check's cost, not the rollout's
    return {"step": step, "reward": metrics["reward"],
            "loss": metrics.get("loss", math.nan), "grad_norm": metrics.get("grad_norm", math.nan),  # nan_skipped
            "icepop_mask_permille": 1e3 * metrics["frac_masked"], "routing_flips": probe.flips[-1],
            "abs_dlogp_mean": metrics["abs_dlogp_mean"], "nan_skipped": metrics["nan_skipped"], **times}


def _summary(arm: str, rows: list[dict], rec: Recorder) -> None:
    rec.put(f"{arm} steps", len(rows))
    for name in SERIES:
        rec.put(f"{arm} mean {name}", statistics.fmean(row[name] for row in rows))
    rec.put(f"{arm} steps with loss != 0", sum(row["loss"] != 0 for row in rows))
    rec.put(f"{arm} steps with grad norm > 0", sum(row["grad_norm"] > 0 for row in rows))
    for part in TIME_SPLIT:
        rec.put(f"{arm} median {part} ms", 1e3 * statistics.median(row[part] for row in rows))


def verdict(steps: dict[str, list[dict]], window: int) -> str:
    """Whether the last arm's final-window mean reward differs from the first's by more than the
    per-step spread allows: the difference of means with a normal 95% interval from each
    window's standard error (consecutive steps are correlated, so this is a screen, not a test)."""
    (name_a, a), (name_b, b) = [(arm, [row["reward"] for row in rows[-window:]]) for arm, rows in steps.items()]
    diff = statistics.fmean(b) - statistics.fmean(a)
    se = math.sqrt(sum(statistics.variance(x) / len(x) if len(x) > 1 else math.inf for x in (a, b)))
    lo, hi = diff - 1.96 * se, diff + 1.96 * se
    differ = lo > 0 or hi < 0
    return (f"final {len(b)} steps' mean reward: {name_b} {statistics.fmean(b):.3f} vs {name_a} "
            f"{statistics.fmean(a):.3f}, difference {diff:+.3f} (95% interval {lo:+.3f} to {hi:+.3f} from the "
            f"per-step spread): the arms {'differ' if differ else 'do not differ'} beyond seed noise")


def _write_steps(steps: dict[str, list[dict]], path: Path) -> None:
    rows = [{"arm": arm, **row} for arm, arm_rows in steps.items() for row in arm_rows]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _plot(steps: dict[str, list[dict]], path: Path) -> None:
    """One panel per series, one line per arm; the last panel the mean time split per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, name in zip(axes.flat, SERIES):
        for arm, rows in steps.items():
            ax.plot([row["step"] for row in rows], [row[name] for row in rows], label=arm)
        ax.set_title(name.replace("_", " "))
        ax.set_xlabel("step")
    axes.flat[0].legend()
    ax = axes.flat[len(SERIES)]
    left = [0.0] * len(steps)
    for part in TIME_SPLIT:
        ms = [1e3 * statistics.fmean(row[part] for row in rows) for rows in steps.values()]
        ax.barh(list(steps), ms, left=left, label=part)
        left = [x + y for x, y in zip(left, ms)]
    ax.set_title("mean step time split (ms)")
    ax.legend()
    axes.flat[-1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
