"""Kernel benchmarks: peak memory of fused logprobs vs naive, and speed of every variant.

    .venv/bin/python benchmarks/bench_kernels.py            # CPU: memory ratio + torch timings
    .venv/bin/python benchmarks/bench_kernels.py --quick    # smaller N for a smoke run

All ratios are measured in the same run and printed. How peak memory is measured:

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` — exact bytes
  held by tensors at the peak, minus the inputs.
* CPU: torch has no allocator statistics on CPU, so each variant runs forward+backward in a
  *fresh subprocess* and we read the process's peak resident set size (``ru_maxrss``) after the
  inputs are allocated and before the call; the difference is the extra memory the call needed
  at its peak. torch's CPU allocator frees straight to malloc; with glibc's mmap threshold pinned
  to 1 MiB (``MALLOC_MMAP_THRESHOLD_``) every tensor buffer is its own mapping, returned to the OS
  on free, so RSS tracks live tensors; a tiny warm-up call first keeps one-off library
  initialisation out of the number. We also print the analytic size of the largest [rows, V]
  fp32 intermediate of each variant as a cross-check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import kernels  # noqa: E402
from kernels.logprobs import chunk_rows  # noqa: E402

QWEN_VOCAB = 151_936
MiB = 1 << 20


def _logprob_inputs(n: int, hidden: int, vocab: int, dtype: torch.dtype, device: str):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, hidden, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(device, dtype).requires_grad_()
    t = torch.randint(0, vocab, (n,), generator=g).to(device)
    return h, w, t


def implementation(op: str, label: str) -> Callable:
    """``"chunked"`` -> the torch implementation, ``"chunked/triton"`` -> the Triton one (forced)."""
    name, _, impl = label.partition("/")
    return kernels.get(op, name, impl=impl or "torch")


def labels(op: str, device: str) -> list[str]:
    """Every variant's torch implementation, plus its Triton one on CUDA."""
    return [n if impl == "torch" else f"{n}/{impl}" for n in kernels.variants(op)
            for impl in kernels.impls(op, n) if impl == "torch" or device == "cuda"]


def _fwd_bwd(variant: str, h, w, t) -> None:
    lp, ent = implementation("logprobs", variant)(h, w, t)
    (lp.sum() + 0.1 * ent.sum()).backward()


def child_peak_rss(variant: str, n: int, hidden: int, vocab: int, dtype: str) -> None:
    """Run in a fresh process: print the peak-RSS increase (bytes) of one forward+backward."""
    small = _logprob_inputs(4, 8, 32, getattr(torch, dtype), "cpu")
    _fwd_bwd(variant, *small)  # warm-up: library init outside the measurement
    h, w, t = _logprob_inputs(n, hidden, vocab, getattr(torch, dtype), "cpu")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    _fwd_bwd(variant, h, w, t)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_extra_bytes": after - before}))


def peak_extra_bytes(variant: str, n: int, hidden: int, vocab: int, dtype: str, device: str) -> int:
    if device == "cuda":
        h, w, t = _logprob_inputs(n, hidden, vocab, getattr(torch, dtype), "cuda")
        _fwd_bwd(variant, *_logprob_inputs(4, 8, 32, getattr(torch, dtype), "cuda"))  # compile/warm-up
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _fwd_bwd(variant, h, w, t)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    cmd = [sys.executable, __file__, "--child", variant, "--n", str(n), "--hidden", str(hidden),
           "--vocab", str(vocab), "--dtype", dtype]
    # A fixed glibc mmap threshold stops malloc from moving freed 32 MiB chunk buffers onto the
    # heap, where fragmentation would keep them resident: RSS then tracks live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


def memory_report(n: int, hidden: int, vocab: int, dtype: str, device: str) -> dict[str, float]:
    variants = labels("logprobs", device)
    peaks = {v: peak_extra_bytes(v, n, hidden, vocab, dtype, device) for v in variants}
    rows = chunk_rows(vocab, None)
    print(f"\n## logprobs peak memory, forward+backward, N={n} H={hidden} V={vocab} {dtype} on {device}")
    print(f"largest [rows, V] fp32 intermediate: naive {n * vocab * 4 / MiB:.0f} MiB, "
          f"chunked {min(rows, n) * vocab * 4 / MiB:.0f} MiB (chunk = {rows} rows)")
    ratios = {}
    for v, b in peaks.items():
        ratios[v] = b / peaks["naive"]
        print(f"{v:>14}: peak extra {b / MiB:8.1f} MiB   ratio vs naive {ratios[v]:.3f}")
    return ratios


def _median_ms(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timing_report(device: str, repeats: int) -> None:
    """Median wall time of each variant and its ratio to the op's baseline variant."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(2048, 1024, generator=g).to(device, dt)
    w = torch.ones(1024, dtype=dt, device=device)
    q = torch.randn(2048, 8, 128, generator=g).to(device, dt)
    pos = torch.arange(2048, device=device)
    logits = torch.randn(4096, 64, generator=g).to(device, dt)
    h, lw, t = (a.detach() for a in _logprob_inputs(256, 256, 32_768, dt, device))
    head = _logprob_inputs(1280, 576, 49_152, dt, device)  # smollm2-135m's lm_head, one RL minibatch of tokens

    def head_step(variant: str) -> Callable[[], None]:  # the RL trainer's use: the logprob's gradient only
        def run() -> None:
            hh, ww = (a.detach().requires_grad_() for a in head[:2])
            lp, _ = implementation("logprobs", variant)(hh, ww, head[2])
            lp.sum().backward()
        return run
    cases: dict[str, tuple[str, Callable[[str], Callable[[], object]]]] = {
        "rmsnorm [2048,1024] bf16 (+residual)": ("reference", lambda v: lambda: implementation("rmsnorm", v)(x, w, 1e-6, x)),
        "rope [2048,8,128] bf16": ("reference", lambda v: lambda: implementation("rope", v)(q, pos, theta=1e6, rotary_dim=128)),
        "router_topk [4096,64] k=8 bf16": ("stable", lambda v: lambda: implementation("router_topk", v)(logits, 8)),
        "logprobs fwd N=256 H=256 V=32768 bf16": ("naive", lambda v: lambda: implementation("logprobs", v)(h, lw, t)),
        "logprobs fwd+bwd N=1280 H=576 V=49152 bf16": ("naive", head_step),
    }
    print(f"\n## median time on {device} ({repeats} repeats), ratio = time / baseline variant")
    for title, (baseline, make) in cases.items():
        op = title.split()[0]
        names = labels(op, device)
        ms = {v: _median_ms(make(v), repeats, sync) for v in names}
        cells = "  ".join(f"{v} {ms[v]:.2f}ms (x{ms[v] / ms[baseline]:.2f})" for v in names)
        print(f"{title}: {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1024, help="tokens (rows) for the memory benchmark")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="N=256 and 3 repeats")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    if args.child:
        child_peak_rss(args.child, args.n, args.hidden, args.vocab, args.dtype)
        return
    if args.quick:
        args.n, args.repeats = 256, 3
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    memory_report(args.n, args.hidden, args.vocab, args.dtype, device)
    if not args.skip_timing:
        timing_report(device, args.repeats)


if __name__ == "__main__":
    main()
