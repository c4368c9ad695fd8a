"""``mlab capture``: capture sites of an engine run to a file, from the command line.

    mlab capture --model PATH --engine hf[:DTYPE]|minirl[:PRESET|DTYPE][,knob=value...]|vllm[:DTYPE][,option=value...]
                 (--text "..." | --ids FILE) [--sites "L*.resid_post,logits"]
                 [--mode tensor|stats] [--dtype D] [--budget-bytes N] --out cap.nc|cap.zarr

``--ids FILE`` is a JSON list of token-id lists (one per request, equal lengths);
``--text`` is tokenized with the checkpoint's own tokenizer. The capture streams to
``--out`` while it runs, so an interrupted run leaves a readable partial file.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "capture", help="capture activations of one engine run (sites of docs/sites.md) to a file",
        description="Run one teacher-forced forward (hf), score (minirl) or prompt-logprobs prefill (vllm) "
                    "and save the captured sites "
                    "as netCDF (.nc) or zarr (.zarr), readable later without the model.")
    p.add_argument("--model", required=True, help="HF checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--engine", default="hf", help="hf[:DTYPE], minirl[:aligned|typical|hf_exact|DTYPE]"
                   "[,knob=value...] or vllm[:DTYPE][,max_model_len=N,max_num_seqs=N,prefix_caching=BOOL,seed=N]")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to tokenize with the checkpoint's tokenizer")
    src.add_argument("--ids", help="JSON file: a list of token-id lists")
    p.add_argument("--sites", default="*", help='glob patterns, comma separated (default "*": all sites)')
    p.add_argument("--mode", choices=["tensor", "stats"], default="tensor",
                   help="tensor: full values; stats: per-token min/max/mean/l2/amax/nan/inf/hash")
    p.add_argument("--dtype", default=None, help="engine dtype when the engine spec names none (default: hf "
                   "float32, vllm bfloat16, minirl bfloat16 for typical and float32 for the aligned presets)")
    p.add_argument("--budget-bytes", type=int, default=None, help="stop (error) before the capture exceeds this")
    p.add_argument("--out", required=True, help="output file: *.nc (netCDF) or *.zarr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check every input, load the engine, capture; the output is written only by a finished run."""
    import aligntools
    from aligntools.cli.inputs import UsageError, checkpoint_config, engine_spec
    from aligntools.tracker.files import check_target
    from aligntools.tracker.journal import partial_path
    from aligntools.tracker.recorder import CaptureBudgetExceeded
    from minirl import build_engine, check_directory_takes_files

    config = checkpoint_config(args.model)
    spec = engine_spec(args.engine, args.dtype)
    ids = _input_ids(args, config)
    check_target(Path(args.out))  # what the capture would replace, and where it can write: before the model loads
    check_directory_takes_files(args.out, "capture")
    try:
        target = build_engine(spec, args.model)
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        raise UsageError(f"cannot load {args.model} as {args.engine}: {type(e).__name__}: {e}") from e
    try:
        with aligntools.Tracker(target, sites=args.sites, mode=args.mode, budget_bytes=args.budget_bytes,
                                out=args.out) as tracker:
            tracker.adapter.run(ids)
    except CaptureBudgetExceeded as e:
        raise UsageError(f"{e} in {partial_path(args.out)}; raise --budget-bytes or use --mode stats") from e
    print(f"{tracker.capture!r} -> {args.out}")
    return 0


def _input_ids(args: argparse.Namespace, config: dict):
    """[batch, seq] int64 ids from ``--text`` or ``--ids``, checked against the model."""
    import torch

    from aligntools.cli.inputs import UsageError, check_ids, ids_from_json, input_path

    if args.text is not None:
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(args.model)
        rows, source = [list(tok(args.text)["input_ids"])], "--text"
        if not rows[0]:
            raise UsageError("--text gives no tokens; give non-empty text")
    else:
        path = input_path(args.ids, "--ids")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--ids {path}: cannot read it ({e})") from e
        source = f"--ids {path}"
        rows = ids_from_json(text, source)
    check_ids(rows, config, source)
    return torch.tensor(rows, dtype=torch.long)
