"""``mlab train``: run minirl RL from a YAML config.

    mlab train --config run.yaml [--resume] [--set key=value ...]

Keys are ``minirl.TrainConfig`` fields (a typo fails with the closest valid key). Exit 0 when
the run finished, 2 on a usage error or a run stopped by repeated non-finite losses.
"""

from __future__ import annotations

import argparse

import yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="RL-train a model on a verifiable task (minirl)",
                              description="GRPO-style RL with a mismatched rollout engine, mismatch corrections "
                                          "(IcePop/TIS/MIS) and router replay; metrics go to <out_dir>/metrics.nc.")
    p.add_argument("--config", required=True, help="YAML file of TrainConfig fields")
    p.add_argument("--resume", action="store_true", help="continue from <out_dir>/checkpoint if present")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key (YAML-typed value); repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minirl.train_config import TrainConfig
    from minirl.trainer import train

    with open(args.config) as f:
        values = yaml.safe_load(f) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{args.config}: expected a mapping of config keys")
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        values[key] = yaml.safe_load(value)
    try:
        result = train(TrainConfig.from_dict(values), resume=args.resume)
    except RuntimeError as e:  # the trainer's own stop (non-finite losses): its message says what to do
        raise ValueError(str(e)) from e
    last = result.rows[-1] if result.rows else {}
    print(f"done: {len(result.rows)} steps, last reward {last.get('reward', float('nan')):.3f}; "
          f"log {result.log_path}")
    return 0
