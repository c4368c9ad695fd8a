"""``mlab``: the project's single console entry point.

Subcommands live next to the code they drive; each module exposes ``register(subparsers)``
that adds its parser and sets ``func`` (returns the process exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from labs import allocator

SUBCOMMANDS = {"zoo": "labs.cli_zoo", "capture": "aligntools.cli.capture", "diff": "aligntools.cli.diff",
               "check": "aligntools.cli.check", "train": "minirl.cli_train", "plot": "minirl.training.plot",
               "audit": "aligntools.cli.audit"}
"""Subcommand -> the module that registers it. Only the command being run is imported (``mlab zoo
list`` should not wait for every other command's torch/transformers imports); ``mlab --help`` and
an unknown command import all of them, so the usage lists every command."""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``mlab`` parser, with only ``argv``'s subcommand registered when it names one."""
    parser = argparse.ArgumentParser(prog="mlab", description="Mismatch Lab: train-inference alignment tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    command = (sys.argv[1:] if argv is None else argv)[:1]
    for name in command if command and command[0] in SUBCOMMANDS else SUBCOMMANDS:
        importlib.import_module(SUBCOMMANDS[name]).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``mlab``; exit codes: 0 ok, 1 check failed, 2 usage error or any other failure.

    Every failure is one line on stderr naming the problem: expected ones (ValueError incl.
    the gates' and CLI's usage errors, OSError incl. a full disk) as their message, anything
    else with its type and a pointer to ``MLAB_DEBUG=1``, which prints the traceback first. The exit
    code never depends on ``MLAB_DEBUG``: a CI script reading 1 as "misaligned" must not see a
    crash that way because someone asked for a traceback.
    Started as a program (``argv`` None), it first re-executes itself on tcmalloc (``labs.allocator``).
    """
    if argv is None:
        allocator.relaunch()
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:
        return _fail(args.command, str(e) if str(e) else type(e).__name__)
    except MemoryError as e:
        return _fail(args.command, f"out of memory ({e or 'allocation failed'}); give a smaller input")
    except Exception as e:  # noqa: BLE001 - a traceback is not an answer for a CLI user
        if os.environ.get("MLAB_DEBUG"):
            traceback.print_exc()
        return _fail(args.command, f"{type(e).__name__}: {e} (set MLAB_DEBUG=1 for the traceback)")


def _fail(command: str, message: str) -> int:
    print(f"mlab {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
