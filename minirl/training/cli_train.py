"""``mlab train``: run minirl RL from a YAML config.

    mlab train --config run.yaml [--resume | --overwrite] [--set key=value ...]

Keys are ``minirl.TrainConfig`` fields (a typo fails with the closest valid key; every value is
checked by ``minirl.training.config_check``). An ``out_dir`` that already holds a run is continued with
``--resume`` (what may change on resume: ``minirl.training.resume``) or replaced with ``--overwrite``;
without either it is refused, so a run is never lost to a repeated command. Exit 0 when the run
finished, 2 on a usage error or a run stopped by repeated non-finite losses, 130 on Ctrl-C (one
line saying which checkpoint is intact).
"""

from __future__ import annotations

import argparse
import sys

import yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="RL-train a model on a verifiable task (minirl)",
                              description="GRPO-style RL with a mismatched rollout engine, mismatch corrections "
                                          "(IcePop/TIS/MIS) and router replay; metrics go to <out_dir>/metrics.nc.")
    p.add_argument("--config", required=True, help="YAML file of TrainConfig fields")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run in out_dir from its checkpoint")
    again.add_argument("--overwrite", action="store_true", help="replace the run already in out_dir")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key (YAML-typed value); repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minirl.training import checkpointing, resume
    from minirl.training.train_config import TrainConfig
    from minirl.training.driver import train

    values = _read_yaml(args.config)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set lr=1e-4")
        values[key.strip()] = _parse(f"--set {item!r}", value)
    config = TrainConfig.from_dict(values)
    found = resume.existing_run(config.out_dir)
    checkpoint = f"{config.out_dir}/checkpoint"
    if args.resume and found and not checkpointing.exists(checkpoint):
        raise ValueError(f"--resume: {config.out_dir} holds a run ({', '.join(found)}) but no checkpoint to continue "
                         f"(checkpoint_every: 0 writes none); start it again with --overwrite")
    if found and not (args.resume or args.overwrite):
        raise ValueError(f"out_dir {config.out_dir} already holds a run ({', '.join(found)}); continue it with "
                         f"--resume, replace it with --overwrite, or set another out_dir")
    try:
        result = train(config, resume=args.resume)
    except RuntimeError as e:  # the trainer's own stop (non-finite losses): its message says what to do
        raise ValueError(str(e)) from e
    except KeyboardInterrupt as e:  # RunInterrupted says where; before the loop, nothing was trained
        print(f"mlab train: {e}" if isinstance(e, resume.RunInterrupted) else
              f"mlab train: interrupted; resume with --resume if {checkpoint} exists", file=sys.stderr)
        return 130
    last = result.rows[-1] if result.rows else {}
    print(f"done: {len(result.rows)} steps, last reward {last.get('reward', float('nan')):.3f}; "
          f"log {result.log_path}")
    return 0


def _read_yaml(path: str) -> dict:
    with open(path) as f:
        values = _parse(path, f.read()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of config keys (key: value lines), got {type(values).__name__}")
    return values


def _parse(where: str, text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None
