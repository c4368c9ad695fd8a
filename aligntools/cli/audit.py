"""``mlab audit RECORDS... --model PATH [--old PATH...] [--json OUT] [--report OUT.html] [--drill]``: name why a
run's engine logprobs differ from the trainer's.

Exit codes (for CI): 0 = aligned within the noise floor, 1 = a cause was found (the verdict line
names the biggest first, with its estimate and share of the gap), 2 = usage error (a missing or
unreadable records file, a bad entry, a checkpoint that does not load). Format: docs/audit.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``audit`` subcommand; the handler is ``args.func(args) -> exit code``."""
    p = subparsers.add_parser("audit", help="name the cause of a run's train-inference mismatch from its records",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", nargs="+", help="rollout records: JSONL/JSON, parquet, slime --save-debug-rollout-data "
                                              "files, verl batches (.pt/.safetensors/.npz), vLLM/SGLang result JSON")
    p.add_argument("--model", required=True, help="the trainer's HF checkpoint directory (scored in fp32)")
    p.add_argument("--old", action="append", default=[], metavar="PATH",
                   help="a checkpoint the engine may have served instead (cause stale_weights); repeatable")
    p.add_argument("--json", default=None, metavar="OUT", help="write {verdict, causes: [{name, estimate, share}]}")
    p.add_argument("--report", default=None, metavar="OUT.html", help="write a self-contained HTML report")
    p.add_argument("--drill", action="store_true",
                   help="for a numeric gap, drill into the site where minirl computing as the fingerprint first "
                        "fails: every tensor op of its module, the first op whose error jumps and its knob")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Audit and print the verdict; return 0 aligned, 1 misaligned (errors propagate to ``mlab``: exit 2)."""
    from aligntools.audit import audit
    from aligntools.audit.drill import drill_numeric
    from aligntools.audit.report import write_report
    from aligntools.audit.run import records_of
    from aligntools.gates.inputs import validate_checkpoint

    for path in [args.model, *args.old]:
        validate_checkpoint(path)  # before any record is read or model loaded
    for flag, out in (("--json", args.json), ("--report", args.report)):
        if out and not Path(out).parent.is_dir():
            raise ValueError(f"{flag} {out}: directory {Path(out).parent} does not exist; create it first")
    result = audit(records_of(args.records), args.model, old=args.old, progress=True)
    print(result.summary())  # the verdict first: a failing write below does not lose it
    if args.drill:
        print(drill_numeric(result, args.model))
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_json(), indent=1) + "\n")
    if args.report:
        write_report(result, args.report)
    return 0 if result.verdict == "aligned" else 1
