"""``mlab train``: run minirl RL from a YAML config.

    mlab train --config run.yaml [--resume | --overwrite] [--set key=value ...]

Keys are ``minirl.TrainConfig`` fields (a typo fails with the closest valid key; every value is
checked by ``minirl.training.config_check``). An ``out_dir`` that already holds a run is continued with
``--resume`` (what may change on resume: ``minirl.training.resume``) or replaced with ``--overwrite``
(only the files that run wrote: ``minirl.training.run_dir``); without either it is refused, so a run
is never lost to a repeated command, and neither is a file some other program wrote there. Exit 0 when the run
finished, 2 on a usage error or a run stopped by repeated non-finite losses, 130 on Ctrl-C (one
line saying which checkpoint is intact). It sits at minirl's root beside ``minirl.driver``, which it
calls: ``minirl.training`` never imports the driver (docs/architecture.md, import rules).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="RL-train a model on a verifiable task (minirl)",
                              description="GRPO-style RL with a mismatched rollout engine, mismatch corrections "
                                          "(IcePop/TIS/MIS) and router replay; metrics go to <out_dir>/metrics.nc.")
    p.add_argument("--config", required=True, help="YAML file of TrainConfig fields")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run in out_dir from its checkpoint")
    again.add_argument("--overwrite", action="store_true",
                       help="replace the run already in out_dir (only the files it wrote)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key (YAML-typed value); repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minirl.driver import train
    from minirl.training import resume
    from minirl.training.config_check import short
    from minirl.training.config_file import parse_yaml, read_config_file
    from minirl.training.train_config import TrainConfig

    values = read_config_file(args.config)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {short(item)}: expected KEY=VALUE, e.g. --set lr=1e-4")
        values[key.strip()] = parse_yaml(value, f"--set {short(item)}")
    config = TrainConfig.from_dict(values)
    if not config.model.strip():  # TrainConfig() needs none (its math is tested without one); a run does
        raise ValueError(f"{args.config}: model is required, the HF checkpoint directory to train (e.g. the path "
                         f"`mlab zoo build tiny-qwen3` prints); add model: PATH to the file, or --set model=PATH")
    try:
        result = train(config, resume=args.resume, overwrite=args.overwrite)
    except RuntimeError as e:  # the trainer's own stop (non-finite losses): its message says what to do
        raise ValueError(str(e)) from e
    except KeyboardInterrupt as e:  # RunInterrupted says where; before the loop, nothing was trained
        print(f"mlab train: {e}" if isinstance(e, resume.RunInterrupted) else
              f"mlab train: interrupted; resume with --resume if {config.out_dir}/checkpoint exists", file=sys.stderr)
        return 130
    trained = [r for r in result.rows if "reward" in r]  # the final evaluation has a row of its own
    last = trained[-1] if trained else {}
    final = result.rows[-1]
    held_out = f", held-out accuracy {final['eval_accuracy']:.3f}" if "eval_accuracy" in final else ""
    print(f"done: {len(trained)} steps, last reward {last.get('reward', float('nan')):.3f}{held_out}; "
          f"log {result.log_path}")
    return 0
