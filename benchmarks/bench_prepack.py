"""Prepacked bf16 weights (``minirl/engine/prepack.py``) against plain ``F.linear``, in one process.

GEMMs: a model's linear shapes at ``--rows`` rows, each weight hot in cache (what a GEMM costs
without the DRAM stream), microseconds per call, best of ``--repeats``. Decode: the engine's
``generate`` (``--batch`` x 32-token prompts x ``--new-tokens``, T = 1, EOS ignored) with packing
on and off in interleaved rounds, tokens per second, and whether both sides sampled the same
tokens with the same logprobs (they must: the packed product is F.linear's bits).

    env $(.venv/bin/python -m labs.allocator) .venv/bin/python benchmarks/bench_prepack.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_engine import _best_times, _zoo_path  # noqa: E402
from minirl import Engine, Knobs, SamplingParams  # noqa: E402
from minirl.engine import prepack  # noqa: E402


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def gemm_table(engine: Engine, rows: int, repeats: int) -> None:
    """One line per distinct weight shape of the engine: F.linear vs packed, us per call."""
    shapes = sorted({tuple(w.shape) for n, w in engine.model.w.items() if w.dim() == 2 and n != "embed"})
    linear = prepack.PrepackedLinear()
    for o, k in shapes:
        w, x = torch.randn(o, k).bfloat16(), torch.randn(rows, k).bfloat16()
        calls = max(5, int(2e8 / (o * k)))
        plain = min(_per_call_us(lambda: F.linear(x, w), calls) for _ in range(repeats))
        packed = min(_per_call_us(lambda: linear(x, w), calls) for _ in range(repeats))
        same = torch.equal(linear(x, w), F.linear(x, w))
        print(f"[{rows}, {k}] @ [{k}, {o}]: F.linear {plain:8.1f} us | packed {packed:8.1f} us | "
              f"{plain / packed:.2f}x | same bits {same}")


@torch.inference_mode()
def decode(engine: Engine, batch: int, new_tokens: int, repeats: int) -> None:
    """Engine decode with packing on and off, interleaved rounds, tokens per second."""
    prompts = torch.randint(3, engine.spec.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, seed=0)
    outputs: dict[str, list] = {}
    on = prepack.available

    def run(packed: bool) -> None:
        prepack.available = on if packed else (lambda: False)  # the switch PrepackedLinear reads per call
        try:
            outputs["packed" if packed else "plain"] = engine.generate(prompts.tolist(), params)
        finally:
            prepack.available = on

    best = _best_times({"plain": lambda: run(False), "packed": lambda: run(True)}, repeats)
    same = all(a.token_ids == b.token_ids and torch.equal(a.logprobs, b.logprobs)
               for a, b in zip(outputs["plain"], outputs["packed"]))
    tok = {k: batch * new_tokens / v for k, v in best.items()}
    print(f"decode (batch {batch}, 32-token prompts, {new_tokens} new tokens): F.linear {tok['plain']:.0f} tok/s | "
          f"packed {tok['packed']:.0f} tok/s | {tok['packed'] / tok['plain']:.2f}x | same tokens and logprobs {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not prepack.available():
        sys.exit("this CPU's torch has no oneDNN bf16 GEMM: the engine does not pack here, nothing to compare")
    engine = Engine.from_pretrained(_zoo_path(args.model), dtype=torch.bfloat16, knobs=Knobs.typical_inference())
    print(f"{args.model} bf16, {args.threads} thread(s), torch {torch.__version__}, best of {args.repeats}")
    gemm_table(engine, args.rows, args.repeats)
    decode(engine, args.batch, args.new_tokens, args.repeats)


if __name__ == "__main__":
    main()
