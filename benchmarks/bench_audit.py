"""The planted-fault suite of ``aligntools.audit``: share of faults named right, false "aligned", time per audit.

    .venv/bin/python benchmarks/bench_audit.py [--families tiny-llama,tiny-qwen3,tiny-qwen3-moe,tiny-mixtral]
        [--seeds 0,1] [--n 8] [--new 24] [--threads 1] [--size smollm2-135m:64x256] [--engines vllm,sglang]

Why: a cause named wrong sends a user to fix the wrong thing, and a false "aligned" hides a bug;
both are counted over every fault of ``aligntools.audit.planted`` (clean records must audit
"aligned", every other fault must name its cause first) on several families, a dense and an MoE
among them. ``--size MODEL:NxT`` also times one audit of N samples x T new tokens of a bf16 engine
on that zoo model (the issue's bound: <= 30 s for 64 x 256 on smollm2-135m), the trainer's forward
alone beside it (the part no fit can save), and the peak RSS; its records are made once (a bf16
``generate`` of 64 x 256 takes minutes) and kept under the zoo directory. ``--engines vllm,sglang`` adds the
records real engines make (their CPU builds, in process) on the tiny MoE: the fp32 engine (clean), its
logprobs shifted by one token (``token_shift``) and the bf16 engine (``numeric``), per seed; run one engine
kind per process (vLLM and SGLang each set process-wide state).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from labs import zoo  # noqa: E402

DENSE_FAULTS = ("clean", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "temperature+top_p",
                "token_shift", "bos_dropped", "stale_weights", "bf16", "quantized_layers")
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
                rows.append(_row(family, fault, seed, planted.cause, result, time.perf_counter() - start))
    return rows


ENGINE_MODEL = "tiny-qwen3-moe"
ENGINE_FAULTS = {"clean": (None, "float32", False), "token_shift": ("token_shift", "float32", True),
                 "bf16": ("numeric", "bfloat16", False)}
"""Real-engine faults: name -> (cause expected first, engine dtype, logprobs shifted by one token)."""


def engine_suite(kinds: list[str], seeds: list[int]) -> list[dict]:
    """The suite's rows for records real engines made (``tests/real_engine_audit.py``'s records, as the
    tests audit them), one per (engine, fault, seed)."""
    import aligntools
    from minirl import build_engine
    from tests.real_engine_audit import engine_records

    path, model = load(ENGINE_MODEL)
    rows = []
    for kind in kinds:
        engines = {dtype: build_engine(f"{kind}:{dtype}", path, rollouts=True) for dtype in ("float32", "bfloat16")}
        for fault, (expected, dtype, shift) in ENGINE_FAULTS.items():
            for seed in seeds:
                records = engine_records(engines[dtype], shift=shift, seed=seed)
                start = time.perf_counter()
                result = aligntools.audit(records, model)
                rows.append(_row(f"{kind}:{ENGINE_MODEL}", fault, seed, expected, result, time.perf_counter() - start))
    return rows


def _row(family: str, fault: str, seed: int, expected: str | None, result, seconds: float) -> dict:  # noqa: ANN001
    """One suite row: the cause named first against the one expected (None: "aligned" expected)."""
    named = result.causes[0].name if result.causes else None
    print(f"{family:24s} {fault:20s} seed {seed}: expected {expected}, named {named} ({seconds:.2f} s)", flush=True)
    return {"family": family, "fault": fault, "seed": seed, "expected": expected, "named": named,
            "right": named == expected, "seconds": seconds,
            "false_aligned": expected is not None and result.verdict == "aligned"}


def sized(spec: str) -> None:
    """Time one audit of N x T bf16-engine records on a zoo model (``smollm2-135m:64x256``), and the
    trainer's fp32 forward over the same records alone."""
    import aligntools
    from aligntools.audit.planted import plant
    from aligntools.audit.score import score
    from aligntools.records import read, write_jsonl

    name, _, shape = spec.partition(":")
    n, new = (int(x) for x in shape.split("x"))
    path, model = load(name)
    cached = path.parent / "audit-records" / f"{name}-bf16-{n}x{new}.jsonl"
    if not cached.is_file():
        start = time.perf_counter()
        cached.parent.mkdir(exist_ok=True)
        write_jsonl(plant(model, "bf16", n=n, new=new).records, cached)
        print(f"records made in {time.perf_counter() - start:.1f} s: {cached}")
    records = read(cached)
    forward = _timed(lambda: score(model, [r.prompt_ids for r in records], [r.completion_ids for r in records]))[1:]
    result, seconds, cpu = _timed(lambda: aligntools.audit(records, model))
    print(f"{name} {n} x {new} on {torch.get_num_threads()} threads: audit {seconds:.1f} s ({cpu:.1f} s CPU), the "
          f"forward alone {forward[0]:.1f} s ({forward[1]:.1f} s CPU); peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB; load {os.getloadavg()[0]:.1f}; "
          f"{result.summary().splitlines()[0]}")


def _timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """(fn(), wall seconds, CPU seconds of this process, all threads): on a shared box the two differ."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="tiny-llama,tiny-qwen3,tiny-qwen3-moe,tiny-mixtral",
                        help="zoo models, comma separated ('' runs --size only)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--n", type=int, default=8, help="records per fault")
    parser.add_argument("--new", type=int, default=24, help="completion tokens per record")
    parser.add_argument("--size", default=None, help="MODEL:NxT, time one audit of that size (bf16 engine)")
    parser.add_argument("--engines", default="", help="real engine kinds whose records join the suite (vllm, sglang)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the box is shared; --size: 0 = "
                        "torch's, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = suite([f for f in args.families.split(",") if f], seeds, args.n, args.new)
    rows += engine_suite([k for k in args.engines.split(",") if k], seeds)
    if rows:
        summarize(rows, args)
    if args.size:
        sized(args.size)


def summarize(rows: list[dict], args: argparse.Namespace) -> None:
    """The suite's numbers: share named right, false "aligned", seconds per audit, and every miss."""
    right = sum(r["right"] for r in rows)
    print(f"\nnamed right: {right} of {len(rows)} ({right / len(rows):.1%}); false aligned: "
          f"{sum(r['false_aligned'] for r in rows)}; families: {args.families}; engines: {args.engines or 'none'}; "
          f"seeds: {args.seeds}; planted: {args.n} records x {args.new} tokens; engines: 12 records x 16 tokens")
    print(f"seconds per audit: median {statistics.median(r['seconds'] for r in rows):.2f}, "
          f"max {max(r['seconds'] for r in rows):.2f}")
    for r in rows:
        if not r["right"]:
            print(f"  wrong: {r['family']} {r['fault']} seed {r['seed']}: expected {r['expected']}, named {r['named']}")


if __name__ == "__main__":
    main()
