"""This box's GEMM rate in float32 and bfloat16, and what bf16 autocast does to a forward + backward.

    .venv/bin/python benchmarks/bench_gemm_dtypes.py [--threads 2] [--rows 2048]

Why: the real-model RL step (issue #27, ≤ 10 s for smollm2-135m) is FLOP-bound, so the box's GEMM
rate sets its floor (docs/measurements/2026-11-26-real-model-step.md §5), and bf16 autocast is only
worth a named trainer option if a bf16 GEMM is faster than an fp32 one here. Shapes are
smollm2-135m's MLP (576 -> 1536 -> 576); every number is a median over repeats in this run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

HIDDEN, INTERMEDIATE = 576, 1536


def median_s(fn, repeats: int = 15) -> float:
    """Median wall time of ``fn()`` after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=2048, help="tokens per GEMM (a trainer minibatch's order)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x, w = torch.randn(args.rows, HIDDEN), torch.randn(INTERMEDIATE, HIDDEN)
    flops = 2 * args.rows * HIDDEN * INTERMEDIATE
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, [{args.rows}, {HIDDEN}] x [{HIDDEN}, "
          f"{INTERMEDIATE}]")
    rate = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = x.to(dtype), w.to(dtype)
        s = median_s(lambda: torch.nn.functional.linear(a, b))
        rate[dtype] = flops / s / 1e9
        print(f"GEMM {str(dtype):15} {s * 1e3:8.2f} ms {rate[dtype]:7.0f} GFLOP/s")
    print(f"bf16 / fp32 GEMM rate: {rate[torch.bfloat16] / rate[torch.float32]:.2f}x")

    mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, INTERMEDIATE), torch.nn.SiLU(),
                              torch.nn.Linear(INTERMEDIATE, HIDDEN))
    step = {}
    for autocast in (False, True):
        def fwd_bwd() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                mlp(x).float().sum().backward()
        step[autocast] = median_s(fwd_bwd, repeats=7)
        print(f"MLP forward + backward, autocast={'bf16' if autocast else 'off':4} {step[autocast] * 1e3:8.1f} ms")
    print(f"autocast / fp32 time: {step[True] / step[False]:.2f}x (> 1: autocast is slower)")


if __name__ == "__main__":
    main()
