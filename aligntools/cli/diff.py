"""``mlab diff a.nc b.nc``: table, first divergence and diagnosis of two saved captures.

Exit codes (for CI): 0 = every site within tolerance, 1 = some site is not, 2 = usage
error (missing or unreadable file, captures that cannot be aligned, bad tolerance file).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings

from aligntools.analyzer.token_align import MODES


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``diff`` subcommand; the handler is ``args.func(args) -> exit code``."""
    p = subparsers.add_parser("diff", help="compare two saved captures",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="trusted capture (training side / baseline), .nc or .zarr")
    p.add_argument("b", help="capture under test (inference side / candidate)")
    p.add_argument("--sites", default=None, help="glob pattern(s), comma separated (default: all shared)")
    p.add_argument("--tolerance", default=None, help="JSON tolerance file (format: docs/analyzer.md, Tolerance policy; aligntools.analyzer.tolerance)")
    p.add_argument("--reference", default=None, help="higher-precision capture of a's side: sets the noise floor")
    p.add_argument("--align", default="strict", choices=MODES, help="token alignment mode")
    p.add_argument("--allow-different-models", action="store_true",
                   help="compare captures whose model_hash differs (e.g. quantized vs original weights)")
    p.add_argument("--max-memory", type=mebibytes, default=None, metavar="MiB",
                   help="read the captures from disk in tiles within this budget, a positive number of MiB "
                        "(default: 1024)")
    p.set_defaults(func=run)
    return p


def mebibytes(text: str) -> int:
    """``--max-memory``: a positive number of MiB -> bytes (argparse's error otherwise, not
    the silent default that 0 used to give, nor a crash deep in the comparison)."""
    try:
        mib = float(text)
    except ValueError:
        mib = math.nan
    if not math.isfinite(mib) or mib * (1 << 20) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of MiB (e.g. 1024), got {text!r}")
    return int(mib * (1 << 20))


def run(args: argparse.Namespace) -> int:
    """Print the comparison of ``args.a`` and ``args.b``; return the exit code. Loader
    warnings (a partial capture) are printed as one ``mlab diff: warning:`` line each; the
    report says it too."""
    from aligntools.tracker.capture_dataset import CaptureFileError
    from aligntools.analyzer.comparison import compare, load_capture
    from aligntools.cli.inputs import input_path

    try:
        for what, path, directory in (("capture", args.a, True), ("capture", args.b, True),
                                      ("--reference", args.reference, True), ("--tolerance", args.tolerance, False)):
            if path is not None:
                input_path(path, what, directory)  # a FIFO would block the first open: refused by what it is
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a, b = load_capture(args.a), load_capture(args.b)
            ref = load_capture(args.reference) if args.reference else None
        for w in caught:
            print(f"mlab diff: warning: {w.message}", file=sys.stderr)
        cmp = compare(a, b, ref, sites=args.sites, align=args.align, tolerance=args.tolerance,
                      labels=(args.a, args.b), allow_different_models=args.allow_different_models,
                      max_memory=args.max_memory)
    except (FileNotFoundError, CaptureFileError, ValueError, TypeError) as e:
        print(f"mlab diff: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(cmp.summary())
    return 0 if cmp.passes else 1
