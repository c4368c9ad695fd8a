"""``mlab``: the project's single console entry point.

Subcommands live next to the code they drive; each module exposes ``register(subparsers)``
that adds its parser and sets ``func`` (returns the process exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMAND_MODULES = ["labs.cli_zoo", "aligntools.cli.capture", "aligntools.cli.diff", "aligntools.cli.check", "minirl.training.cli_train",
                      "minirl.training.plot"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlab", description="Mismatch Lab: train-inference alignment tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``mlab``; exit codes: 0 ok, 1 check failed, 2 usage error or any other failure.

    Every failure is one line on stderr naming the problem: expected ones (ValueError incl.
    the gates' and CLI's usage errors, OSError incl. a full disk) as their message, anything
    else with its type and a pointer to ``MLAB_DEBUG=1``, which re-raises for the traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:
        return _fail(args.command, str(e) if str(e) else type(e).__name__)
    except MemoryError as e:
        return _fail(args.command, f"out of memory ({e or 'allocation failed'}); give a smaller input")
    except Exception as e:  # noqa: BLE001 - a traceback is not an answer for a CLI user
        if os.environ.get("MLAB_DEBUG"):
            raise
        return _fail(args.command, f"{type(e).__name__}: {e} (set MLAB_DEBUG=1 for the traceback)")


def _fail(command: str, message: str) -> int:
    print(f"mlab {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
