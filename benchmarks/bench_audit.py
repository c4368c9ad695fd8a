"""The planted-fault suite of ``aligntools.audit``: share of faults named right, false "aligned", time per audit.

    .venv/bin/python benchmarks/bench_audit.py [--families tiny-llama,tiny-qwen3,tiny-qwen3-moe,tiny-mixtral]
        [--seeds 0,1] [--n 8] [--new 24] [--threads 1] [--size smollm2-135m:64x256]

Why: a cause named wrong sends a user to fix the wrong thing, and a false "aligned" hides a bug;
both are counted over every fault of ``aligntools.audit.planted`` (clean records must audit
"aligned", every other fault must name its cause first) on several families, a dense and an MoE
among them. ``--size MODEL:NxT`` also times one audit of N samples x T new tokens of a bf16 engine
on that zoo model (the issue's bound: <= 30 s for 64 x 256 on smollm2-135m).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from labs import zoo  # noqa: E402

DENSE_FAULTS = ("clean", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "temperature+top_p",
                "token_shift", "bos_dropped", "stale_weights", "bf16")
MOE_FAULTS = (*DENSE_FAULTS, "routing")


def load(name: str, seed: int = 0):
    import transformers

    root = Path(os.environ.get("MLAB_ZOO_DIR", ROOT / ".zoo"))  # the tests' checkpoints, built once
    path = zoo.build(name, out=root / f"{name}-seed{seed}", seed=seed, progress=False)
    return path, transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def suite(families: list[str], seeds: list[int], n: int, new: int) -> list[dict]:
    """One row per (family, fault, seed): expected cause, named cause, seconds per audit."""
    import aligntools
    from aligntools.audit.planted import plant

    rows = []
    for family in families:
        _, model = load(family)
        faults = MOE_FAULTS if getattr(model.config, "num_experts", None) else DENSE_FAULTS
        for fault in faults:
            for seed in seeds:
                planted = plant(model, fault, n=n, new=new, seed=seed)
                start = time.perf_counter()
                result = aligntools.audit(planted.records, model, old=planted.old)
                seconds = time.perf_counter() - start
                named = result.causes[0].name if result.causes else None
                rows.append({"family": family, "fault": fault, "seed": seed, "expected": planted.cause,
                             "named": named, "right": named == planted.cause, "seconds": seconds,
                             "false_aligned": planted.cause is not None and result.verdict == "aligned"})
                print(f"{family:16s} {fault:20s} seed {seed}: expected {planted.cause}, named {named} "
                      f"({seconds:.2f} s)", flush=True)
    return rows


def sized(spec: str) -> None:
    """Time one audit of N x T bf16-engine records on a zoo model (``smollm2-135m:64x256``)."""
    import aligntools
    from aligntools.audit.planted import plant

    name, _, shape = spec.partition(":")
    n, new = (int(x) for x in shape.split("x"))
    _, model = load(name)
    start = time.perf_counter()
    planted = plant(model, "bf16", n=n, new=new)
    made = time.perf_counter() - start
    start = time.perf_counter()
    result = aligntools.audit(planted.records, model)
    print(f"{name} {n} x {new}: records made in {made:.1f} s; audit {time.perf_counter() - start:.1f} s; "
          f"{result.summary().splitlines()[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="tiny-llama,tiny-qwen3,tiny-qwen3-moe,tiny-mixtral",
                        help="zoo models, comma separated ('' runs --size only)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--n", type=int, default=8, help="records per fault")
    parser.add_argument("--new", type=int, default=24, help="completion tokens per record")
    parser.add_argument("--size", default=None, help="MODEL:NxT, time one audit of that size (bf16 engine)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the box is shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = suite([f for f in args.families.split(",") if f], [int(s) for s in args.seeds.split(",")], args.n, args.new)
    if rows:
        summarize(rows, args)
    if args.size:
        sized(args.size)


def summarize(rows: list[dict], args: argparse.Namespace) -> None:
    """The suite's numbers: share named right, false "aligned", seconds per audit, and every miss."""
    right = sum(r["right"] for r in rows)
    print(f"\nnamed right: {right} of {len(rows)} ({right / len(rows):.1%}); false aligned: "
          f"{sum(r['false_aligned'] for r in rows)}; families: {args.families}; seeds: {args.seeds}; "
          f"{args.n} records x {args.new} tokens")
    print(f"seconds per audit: median {statistics.median(r['seconds'] for r in rows):.2f}, "
          f"max {max(r['seconds'] for r in rows):.2f}")
    for r in rows:
        if not r["right"]:
            print(f"  wrong: {r['family']} {r['fault']} seed {r['seed']}: expected {r['expected']}, named {r['named']}")


if __name__ == "__main__":
    main()
