"""The engine's bf16 linear paths (``minirl/engine/prepack.py``) against plain ``F.linear`` and fp32, in one process.

GEMMs: a model's linear shapes at ``--rows`` rows, each weight hot in cache (what a GEMM costs
without the DRAM stream), microseconds per call, best of ``--repeats``: fp32, bf16 ``F.linear``
(torch's native kernel), bf16 emulated (fp32 GEMM on the bf16 operands, the path of CPUs without
native bf16) and bf16 packed (oneDNN's kernel on a weight packed once; only where this CPU's torch
has oneDNN bf16). Decode: the engine's ``generate`` (``--batch`` x 32-token prompts x
``--new-tokens``, T = 1, EOS ignored) in fp32 and in bf16 on each path, interleaved rounds, tokens
per second, and how each bf16 path's tokens and logprobs compare with ``F.linear``'s (packed: the
same bits; emulated: the same GEMMs up to summation order).

    env $(.venv/bin/python -m labs.allocator) .venv/bin/python benchmarks/bench_prepack.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import os
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

PATHS = ("plain", "emulated", *(("packed",) if prepack.available() else ()))
"""The bf16 paths this box can run: ``F.linear`` (forced native, no packing), emulated, packed."""


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(5):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def run_on(path: str, fn: Callable[[], object]) -> object:
    """``fn()`` with the engine's bf16 linear forced onto ``path`` (the switches PrepackedLinear
    reads per call: ``prepack.ENV`` and, for ``plain``, no oneDNN)."""
    env, available = os.environ.get(prepack.ENV), prepack.available
    os.environ[prepack.ENV] = "emulated" if path == "emulated" else "native"
    if path == "plain":
        prepack.available = lambda: False
    try:
        return fn()
    finally:
        prepack.available = available
        if env is None:
            del os.environ[prepack.ENV]
        else:
            os.environ[prepack.ENV] = env


def gemm_table(engine: Engine, rows: int, repeats: int) -> None:
    """One line per distinct weight shape of the engine: fp32 and each bf16 path, us per call."""
    shapes = sorted({tuple(w.shape) for n, w in engine.model.w.items() if w.dim() == 2 and n != "embed"})
    for o, k in shapes:
        w, x = torch.randn(o, k), torch.randn(rows, k)
        wb, xb = w.bfloat16(), x.bfloat16()
        calls = max(5, int(2e8 / (o * k)))
        us = {"fp32": min(_per_call_us(lambda: F.linear(x, w), calls) for _ in range(repeats))}
        for path in PATHS:
            linear = prepack.PrepackedLinear()
            us[path] = min(run_on(path, lambda: _per_call_us(lambda: linear(xb, wb), calls)) for _ in range(repeats))
        print(f"[{rows}, {k}] @ [{k}, {o}]: " + " | ".join(f"{p} {t:9.1f} us ({us['fp32'] / t:4.2f}x)"
                                                             for p, t in us.items()))


@torch.inference_mode()
def decode(path: Path, batch: int, new_tokens: int, repeats: int) -> None:
    """Engine decode in fp32 and in bf16 on each path, interleaved rounds, tokens per second."""
    engines = {"fp32": Engine.from_pretrained(path, dtype=torch.float32, knobs=Knobs.typical_inference()),
               "bf16": Engine.from_pretrained(path, dtype=torch.bfloat16, knobs=Knobs.typical_inference())}
    prompts = torch.randint(3, engines["fp32"].spec.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, seed=0)
    outputs: dict[str, list] = {}

    def run(name: str) -> None:
        engine = engines["fp32" if name == "fp32" else "bf16"]
        outputs[name] = run_on(name, lambda: engine.generate(prompts.tolist(), params))

    best = _best_times({name: (lambda name=name: run(name)) for name in ("fp32", *PATHS)}, repeats)
    tok = {k: batch * new_tokens / v for k, v in best.items()}
    print(f"decode (batch {batch}, 32-token prompts, {new_tokens} new tokens), tok/s and fp32's time over this one's: "
          + " | ".join(f"{k} {v:.0f} ({v / tok['fp32']:.2f}x)" for k, v in tok.items()))
    for name in PATHS[1:]:
        print(f"  bf16 {name} vs F.linear: {_compare(outputs[name], outputs['plain'])}")


def _compare(a: list, b: list) -> str:
    """Same tokens? max |logprob difference| over each rollout's tokens up to its first differing one."""
    gaps, same = [], 0
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (s, t) in enumerate(zip(x.token_ids, y.token_ids)) if s != t), len(y.token_ids))
        same += n == len(y.token_ids)
        gaps.append(float((x.logprobs[:n] - y.logprobs[:n]).abs().max()) if n else 0.0)
    return f"{same}/{len(b)} rollouts the same tokens, max |logprob difference| {max(gaps):.2e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-gemms", action="store_true", help="the decode line only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = _zoo_path(args.model)
    print(f"{args.model}, {args.threads} thread(s), torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 {prepack.available()}, best of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.2f}")
    if not args.skip_gemms:
        gemm_table(Engine.from_pretrained(path, dtype=torch.bfloat16), args.rows, args.repeats)
    decode(path, args.batch, args.new_tokens, args.repeats)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
