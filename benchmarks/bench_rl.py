"""Wall time per minirl RL step, split by phase (rollout / old logprobs / update / sync).

    MLAB_ZOO_DIR=.zoo .venv/bin/python benchmarks/bench_rl.py [--steps 5] [--model PATH] [--set key=value ...]

Runs ``minirl.train`` on the zoo Qwen3-MoE (1-digit arithmetic, 8 prompts x 8 samples, bf16
rollout engine, IcePop) and prints the median of each phase over the steps after the first
(the first includes one-off warm-up). The phase times are the ``time_*`` metrics every run logs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import yaml

from labs import zoo
from minirl.train_config import TrainConfig
from minirl.trainer import train

PHASES = ("time_rollout", "time_old_logprobs", "time_update", "time_sync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default=None, help="checkpoint (default: zoo tiny-qwen3-moe)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="TrainConfig override")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is warm-up and not timed)")
    values = dict(model=args.model or str(zoo.build("tiny-qwen3-moe")), steps=args.steps, eval_every=0,
                  checkpoint_every=0, prompts_per_step=8, group_size=8, max_new_tokens=8, progress=False)
    for item in args.set:
        key, _, value = item.partition("=")
        values[key] = yaml.safe_load(value)
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig.from_dict({**values, "out_dir": out})
        rows = train(cfg).rows[1:]
    medians = {p: statistics.median(r[p] for r in rows) for p in PHASES}
    total = sum(medians.values())
    print(f"minirl RL step ({cfg.prompts_per_step}x{cfg.group_size} samples, <= {cfg.max_new_tokens} new tokens, "
          f"engine {cfg.engine} {cfg.engine_dtype}, {len(rows)} timed steps): {total:.3f} s/step")
    for p in PHASES:
        print(f"  {p[5:]:<13} {medians[p]:8.3f} s  {100 * medians[p] / total:5.1f} %")


if __name__ == "__main__":
    main()
