"""This box's GEMM rate in fp32, native bf16 and emulated bf16, and what each does to a forward + backward.

    .venv/bin/python benchmarks/bench_gemm_dtypes.py [--threads 1] [--rows 2048]

Why: the real-model RL step (issue #27, ≤ 10 s for smollm2-135m) is FLOP-bound, so the box's GEMM
rate sets its floor (docs/measurements/2026-11-26-real-model-step.md §5), and bf16 is only worth
being the default of rollouts and a trainer option if a bf16 GEMM is no slower than an fp32 one here.
Where the CPU has no native bf16 (no oneDNN bf16: AVX2 only), torch's bf16 GEMM is a slow fallback,
so minirl emulates it (issue 60): fp32 GEMMs on the bf16 operands, the weight's fp32 copy kept, the
output rounded once to bf16 (``minirl/engine/prepack.py`` for the engine, ``minirl/engine/bf16_gemm.py``
for the trainer). This prints the three side by side at smollm2-135m's shapes (``[N, 576] x [576, O]``,
O = 1536 its MLP, 49152 its lm_head; N = 32 a decode step, ``--rows`` a trainer minibatch), the
oneDNN-packed one where the box has it, which path minirl picks here and the CPU capability; then
smollm2's MLP (576 -> 1536 -> 576) forward + backward in fp32, under bf16 autocast, and as a bf16
copy (the trainer's ``trainer_dtype: bfloat16``) native and emulated. Every number is a median over
interleaved rounds in this run; on a busy box use ``--threads 1`` (two OpenMP threads wait on each
other behind another process's work).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from copy import deepcopy

import torch
import torch.nn.functional as F

from minirl.engine import prepack
from minirl.engine.bf16_gemm import Bf16Gemms

HIDDEN, INTERMEDIATE, VOCAB = 576, 1536, 49152


def medians_ms(sides: dict[str, Callable[[], object]], budget_s: float = 6.0) -> dict[str, float]:
    """Median wall time of each side in ms, over 3-15 interleaved rounds (as many as fit
    ``budget_s``) after a warm-up round: load from other processes hits every side alike."""
    warm = {}
    for name, fn in sides.items():
        t = time.perf_counter()
        fn()
        warm[name] = time.perf_counter() - t
    rounds = min(15, max(3, int(budget_s / sum(warm.values()))))
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


@contextlib.contextmanager
def forced(choice: str) -> Iterator[None]:
    """minirl's bf16 GEMM path forced to ``choice`` (``prepack.ENV``) inside the block."""
    before = os.environ.get(prepack.ENV)
    os.environ[prepack.ENV] = choice
    try:
        yield
    finally:
        if before is None:
            del os.environ[prepack.ENV]
        else:
            os.environ[prepack.ENV] = before


def gemm_row(n: int, o: int) -> None:
    """One shape: fp32, native bf16, emulated bf16 (and packed where oneDNN runs bf16), ms per call."""
    x, w = torch.randn(n, HIDDEN), torch.randn(o, HIDDEN)
    xb, wb = x.bfloat16(), w.bfloat16()
    w32 = wb.float()  # the emulated path's kept fp32 copy of the bf16 weight
    sides = {"fp32": lambda: F.linear(x, w), "bf16 native": lambda: F.linear(xb, wb),
             "bf16 emulated": lambda: prepack.emulated_linear(xb, w32, None)}
    if prepack.available():
        packed = prepack.PrepackedLinear()
        sides["bf16 packed"] = lambda: packed(xb, wb)
    with forced("native"):
        ms = medians_ms(sides)
    cells = " | ".join(f"{name} {t:9.2f} ms ({ms['fp32'] / t:4.2f}x)" for name, t in ms.items())
    print(f"[{n:5}, {HIDDEN}] x [{HIDDEN}, {o:5}]: {cells}")


def mlp_rows(rows: int) -> None:
    """smollm2's MLP forward + backward: fp32, bf16 autocast, a bf16 copy native and emulated."""
    x = torch.randn(rows, HIDDEN)
    mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, INTERMEDIATE), torch.nn.SiLU(),
                              torch.nn.Linear(INTERMEDIATE, HIDDEN))
    bf16, xb = deepcopy(mlp).bfloat16(), x.bfloat16()
    emulation = Bf16Gemms()

    def step(model: torch.nn.Module, inp: torch.Tensor, ctx: contextlib.AbstractContextManager) -> None:
        with ctx:
            model(inp).float().sum().backward()

    sides = {"fp32": lambda: step(mlp, x, contextlib.nullcontext()),
             "autocast bf16": lambda: step(mlp, x, torch.autocast("cpu", dtype=torch.bfloat16)),
             "bf16 copy, native": lambda: step(bf16, xb, contextlib.nullcontext()),
             "bf16 copy, emulated": lambda: step(bf16, xb, emulation)}
    ms = medians_ms(sides)
    for name, t in ms.items():
        print(f"MLP forward + backward, {name:20} {t:8.1f} ms  ({t / ms['fp32']:5.2f}x fp32's time)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=2048, help="tokens per GEMM (a trainer minibatch's order)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with forced("auto"):
        path = "emulated" if prepack.emulates() else "native"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 {prepack.available()}: minirl's bf16 GEMMs "
          f"run {path} here; load average {os.getloadavg()[0]:.2f}")
    for o in (INTERMEDIATE, VOCAB):
        for n in (32, args.rows):
            gemm_row(n, o)
    print("(Nx: fp32's time over this one's, > 1 faster)")
    mlp_rows(args.rows)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
