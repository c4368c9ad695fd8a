"""``mlab check``: the alignment gate from the command line (CI-friendly exit codes).

    mlab check --model PATH --train hf[:DTYPE][,attn=...] --infer minirl[:PRESET][,knob=value...] | vllm[:DTYPE] | sglang[:DTYPE]
               [--dtype float32|bfloat16] [--tokens N] [--tolerance FILE] [--report out.html] [--drill]

Exit codes: 0 aligned, 1 misaligned, 2 usage error (bad path, unknown knob, unreadable
checkpoint, unwritable report). A ``--report`` that is no place for a file (a device node, FIFO,
socket, directory, or an existing capture) is refused before the check runs; a failure to create
the file is found only when it is written, after the verdict is printed, so the full answer is
still in the terminal.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check", help="alignment gate: is the inference engine aligned with the training engine?",
        description="Run the training engine (transformers) and an inference engine (minirl or real vLLM) on the same "
                    "tokens, compare them site by site, routing and final logprobs against limits derived "
                    "from the training engine's own error vs float64. Exit 0 aligned, 1 misaligned, 2 usage error.")
    p.add_argument("--model", required=True, help="HF checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--train", default="hf", help="training engine: hf[:DTYPE][,attn=eager|sdpa][,experts=...] "
                                                 "(default: hf = float32 with transformers' own kernels)")
    p.add_argument("--infer", default="minirl",
                   help="inference engine: minirl[:PRESET][,knob=value...] (presets typical (default), aligned, "
                        "hf_exact), vllm[:DTYPE][,option=value...] (real vLLM, in process) or "
                        "sglang[:DTYPE][,max_total_tokens=N] (real SGLang, in process: docs/sglang.md)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="inference dtype (default: bfloat16 for typical, float32 for aligned and hf_exact)")
    p.add_argument("--tokens", type=int, default=256, help="tokens of built-in text to run (default: 256)")
    p.add_argument("--tolerance", default=None, help="JSON file overriding the per-site tolerance rules")
    p.add_argument("--report", default=None, help="write a self-contained HTML report here")
    p.add_argument("--exclude", action="append", default=[], metavar="SITE",
                   help="leave this site out of the verdict (repeat, or comma-separate); a layer site only one "
                        "side captures fails the gate unless excluded here")
    p.add_argument("--drill", action="store_true",
                   help="also drill into the first divergent site: every tensor op of its module on both engines, "
                        "the first op whose error jumps and the knob that aligns it (aligntools.drill)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aligntools.cli.inputs import input_path
    from aligntools.gates.inputs import validate_checkpoint
    from minirl.output_paths import check_output_file

    if args.report:  # the output first: nothing is read or computed for a report that cannot be written
        check_output_file(args.report, "report")
    if args.tolerance:
        input_path(args.tolerance, "--tolerance")  # a FIFO would block its read after the captures
    validate_checkpoint(args.model)  # a mistyped path is named before the gate's imports (pandas, xarray, plots)
    from aligntools.drilldown.gate import drill_first_divergence
    from aligntools.gates.alignment import check_alignment

    result = check_alignment(args.model, train=args.train, infer=args.infer, dtype=args.dtype,
                             tokens=args.tokens, tolerance=args.tolerance, progress=sys.stderr.isatty(),
                             exclude=[site for arg in args.exclude for site in arg.split(",") if site])
    note = drill_first_divergence(result, args.model, args.train, args.infer, args.dtype) if args.drill else None
    print(result.summary())
    if note:
        print(note)
    if args.report:
        print(f"report: {result.write_report(args.report)}")
    return 0 if result.passed else 1
