"""``mlab``: the project's single console entry point.

Subcommands live next to the code they drive; each module exposes ``register(subparsers)``
that adds its parser and sets ``func`` (returns the process exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = ["labs.cli_zoo", "aligntools.cli.capture", "aligntools.cli.diff", "aligntools.cli.check"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlab", description="Mismatch Lab: train-inference alignment tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``mlab``; exit codes: 0 ok, 1 check failed, 2 usage error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"mlab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
