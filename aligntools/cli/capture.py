"""``mlab capture``: capture sites of an engine run to a file, from the command line.

    mlab capture --model PATH --engine hf|minirl[:PRESET][,knob=value...]
                 (--text "..." | --ids FILE) [--sites "L*.resid_post,logits"]
                 [--mode tensor|stats] [--dtype D] [--budget-bytes N] --out cap.nc|cap.zarr

``--ids FILE`` is a JSON list of token-id lists (one per request, equal lengths);
``--text`` is tokenized with the checkpoint's own tokenizer. The capture streams to
``--out`` while it runs, so an interrupted run leaves a readable partial file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "capture", help="capture activations of one engine run (sites of docs/sites.md) to a file",
        description="Run one teacher-forced forward (hf) or score (minirl) and save the captured sites "
                    "as netCDF (.nc) or zarr (.zarr), readable later without the model.")
    p.add_argument("--model", required=True, help="HF checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--engine", default="hf", help="hf[:DTYPE] or minirl[:aligned|typical|hf_exact][,knob=value...]")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to tokenize with the checkpoint's tokenizer")
    src.add_argument("--ids", help="JSON file: a list of token-id lists")
    p.add_argument("--sites", default="*", help='glob patterns, comma separated (default "*": all sites)')
    p.add_argument("--mode", choices=["tensor", "stats"], default="tensor",
                   help="tensor: full values; stats: per-token min/max/mean/l2/amax/nan/inf/hash")
    p.add_argument("--dtype", default=None, help="engine dtype when the engine spec does not fix it")
    p.add_argument("--budget-bytes", type=int, default=None, help="stop (error) before the capture exceeds this")
    p.add_argument("--out", required=True, help="output file: *.nc (netCDF) or *.zarr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import aligntools
    from aligntools.gates.engine_spec import load_target

    ids = _input_ids(args)
    target = load_target(args.engine, args.model, args.dtype)
    with aligntools.Tracker(target, sites=args.sites, mode=args.mode, budget_bytes=args.budget_bytes,
                            out=args.out) as tracker:
        tracker.adapter.run(ids)
    cap = tracker.capture
    print(f"{cap!r} -> {args.out}")
    return 0


def _input_ids(args: argparse.Namespace):
    import torch

    if args.text is not None:
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(args.model)
        return torch.tensor([tok(args.text)["input_ids"]])
    path = Path(args.ids)
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--ids {path}: not JSON ({e})") from e
    if not (isinstance(rows, list) and rows and all(isinstance(r, list) and r for r in rows)
            and len({len(r) for r in rows}) == 1):
        raise ValueError(f"--ids {path}: expected a JSON list of equal-length, non-empty token-id lists")
    return torch.tensor(rows)
