"""Wall time and peak RSS per minirl RL step, split by phase (rollout / old logprobs / update / sync).

    MLAB_ZOO_DIR=.zoo .venv/bin/python benchmarks/bench_rl.py [--steps 5] [--model NAME|PATH] [--same-batch]
        [--profile] [--set key=value ...]

``--model`` is a zoo name (default tiny-qwen3-moe: 1-digit arithmetic, <= 8 new tokens, SFT
warm-up) or a checkpoint path; ``smollm2-135m`` (the real instruct model) runs the issue's step
instead: ``chat_arithmetic`` in its chat template, no warm-up, <= 32 new tokens. Always 8 prompts
x 8 samples, IcePop. Printed: the median of each phase over the steps after the first (the first
includes one-off warm-up), from the ``time_*`` metrics every run logs, and the median peak RSS of
a step (VmHWM, reset before each step). ``--same-batch`` (for a slow real model): one full step,
then ``--steps`` more ``learn`` calls (old logprobs + update) on that step's rollouts, so the
trainer's share is timed without paying the rollout again. ``--profile``: a torch-profiler table
of the first step. ``--ab KEY=VALUE`` (repeatable): the same trainer alternates full steps under
the base config and under the base config plus these overrides (a second rollout engine when they
name one), in the order AB BA AB ..., so outside load hits both alike; each side's first step
is warm-up and dropped, and the new/base ratio of every phase is printed. For example:

    .venv/bin/python benchmarks/bench_rl.py --model smollm2-135m --set engine=vllm --steps 3 \
        --ab engine=minirl:typical,share_prefill=true --ab engine_dtype=float32 --ab shared_prefix=true
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from labs import zoo
from minirl.engines import build_engine
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import Trainer

PHASES = ("time_rollout", "time_old_logprobs", "time_update", "time_sync")
TINY = dict(max_new_tokens=8)
REAL = dict(task="chat_arithmetic", task_kwargs={"digits": 2, "second_digits": 1}, sft_steps=0, max_new_tokens=32)
"""smollm2-135m: the issue's step (8 x 8 x 32) on the task it starts at 10-60 % on."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default="tiny-qwen3-moe", help="zoo name or checkpoint directory")
    parser.add_argument("--same-batch", action="store_true", help="one full step, then --steps learn calls on it")
    parser.add_argument("--profile", action="store_true", help="torch-profiler table of the first step")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="TrainConfig override")
    parser.add_argument("--ab", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides of the 'new' side of an interleaved base-vs-new comparison")
    args = parser.parse_args()
    if args.steps < 2 and not args.same_batch:
        parser.error("--steps must be >= 2 (the first step is warm-up and not timed)")
    path = Path(args.model) if Path(args.model).is_dir() else zoo.build(args.model)
    values = dict(model=str(path), steps=args.steps, eval_every=0, checkpoint_every=0, prompts_per_step=8,
                  group_size=8, progress=False, **(REAL if args.model == "smollm2-135m" else TINY))
    values.update(overrides(args.set))
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig.from_dict({**values, "out_dir": out})
        trainer = Trainer(cfg)
        if args.ab:
            compare(trainer, TrainConfig.from_dict({**values, **overrides(args.ab), "out_dir": out}), args.steps)
            return
        with profiled(args.profile):
            first = measured(lambda: trainer.train_step(0), trainer)
        if args.same_batch:
            report("first step (warm-up)", cfg, [first])
            rows = [measured(lambda: trainer.learn(*trainer.kept), trainer) for _ in range(args.steps)]
            print(f"learn on the first step's rollouts, median of {len(rows)}: old_logprobs "
                  f"{statistics.median(r['time_old_logprobs'] for r in rows):.3f} s, update "
                  f"{statistics.median(r['time_update'] for r in rows):.3f} s, peak RSS "
                  f"{statistics.median(r['peak_rss_mib'] for r in rows):.0f} MiB")
            return
        rows = []
        for step in range(1, cfg.steps):
            trainer.step = step
            rows.append(measured(lambda: trainer.train_step(step), trainer))
        report("timed steps", cfg, rows)


def overrides(items: list[str]) -> dict:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML, as a config file would)."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = yaml.safe_load(value)
    return out


def compare(trainer: Trainer, new: TrainConfig, steps: int) -> None:
    """Full steps alternating base / new config on one trainer (AB BA ...; both sides sample step
    k's prompts), then each side's report and the new/base ratio of every phase."""
    base = trainer.cfg
    same_engine = (new.engine, new.engine_dtype) == (base.engine, base.engine_dtype)
    sides = {"base": (base, trainer.engine),
             "new": (new, trainer.engine if same_engine else build_engine(new.engine, trainer.model_path,
                                                                           new.engine_dtype, rollouts=True))}
    rows: dict[str, list[dict]] = {"base": [], "new": []}
    for step in range(steps):
        for name in ("base", "new") if step % 2 == 0 else ("new", "base"):
            trainer.cfg, trainer.engine = sides[name]
            trainer.groups.cfg = trainer.cfg
            trainer.step = step
            rows[name].append(measured(lambda: trainer.train_step(step), trainer))
    print(f"load average {os.getloadavg()[0]:.2f}; peak RSS is the process's, with both engines resident")
    for name, (cfg, _) in sides.items():
        changed = {k: v for k, v in new.to_dict().items() if base.to_dict()[k] != v} if name == "new" else {}
        report(f"{name}{' ' + str(changed) if changed else ''}", cfg, rows[name][1:])
    for p in (*PHASES, "s_step"):
        a, b = (statistics.median(r[p] for r in rows[n][1:]) for n in ("base", "new"))
        print(f"  new/base {p:<18} {b / a if a else float('nan'):6.3f}  ({a:.3f} s -> {b:.3f} s)")


def measured(run, trainer: Trainer) -> dict:  # noqa: ANN001 - a zero-argument callable returning metrics
    """``run()``'s metrics plus ``s_step`` (wall time) and ``peak_rss_mib`` (VmHWM, reset first);
    ``trainer.kept`` becomes the arguments of the last ``learn`` call (for ``--same-batch``)."""
    learn = type(trainer).learn

    def keep(*a):  # noqa: ANN002 - learn's own arguments
        trainer.kept = a
        return learn(trainer, *a)

    trainer.learn = keep
    reset_peak()
    t = time.perf_counter()
    metrics = run()
    elapsed = time.perf_counter() - t
    del trainer.learn
    return {**metrics, "s_step": elapsed, "peak_rss_mib": rss_kb("VmHWM") / 1024}


@contextlib.contextmanager
def profiled(enabled: bool):
    """Print a torch-profiler table (by self CPU time) of the block when ``enabled``."""
    if not enabled:
        yield
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def report(what: str, cfg: TrainConfig, rows: list[dict]) -> None:
    medians = {p: statistics.median(r[p] for r in rows) for p in (*PHASES, "s_step", "peak_rss_mib", "length")}
    total = sum(medians[p] for p in PHASES)
    print(f"[{what}] minirl RL step ({Path(cfg.model).name}, {cfg.prompts_per_step}x{cfg.group_size} samples, "
          f"<= {cfg.max_new_tokens} new tokens (mean {medians['length']:.1f}), engine {cfg.engine} "
          f"{cfg.engine_dtype}, {torch.get_num_threads()} threads, {len(rows)} steps): {total:.3f} s/step "
          f"(wall {medians['s_step']:.3f} s), peak RSS {medians['peak_rss_mib']:.0f} MiB")
    for p in PHASES:
        print(f"  {p[5:]:<13} {medians[p]:8.3f} s  {100 * medians[p] / total:5.1f} %")


def reset_peak() -> int:
    """Give freed heap back to the OS and reset the peak-RSS mark -> RSS now (kB)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return rss_kb("VmRSS")


def rss_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


if __name__ == "__main__":
    main()
