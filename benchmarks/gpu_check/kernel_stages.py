"""Stages: each Triton kernel against its torch twin, and the fused logprobs' peak memory.

Errors are measured against the twin ``kernels.TORCH_TWIN`` names (the variant with the same
semantics, which the CPU tests hold the kernel to). Speed is the median of ``plan.repeats`` calls
beside the twin in eager mode and under ``torch.compile``. For logprobs the compiled baseline is
the ``naive`` variant: the twin's Python chunk loop would unroll into one graph per chunk.
Bandwidth counts the bytes of every input and output once (the least any kernel must move) and
is given as a fraction of a device-to-device copy timed in the same run.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

import kernels
from benchmarks.bench_kernels import _median_ms, peak_extra_bytes
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.runner import Recorder
from tests.kernels.kernels_testutil import max_ulps

COMPILED = {**kernels.TORCH_TWIN, "logprobs": "naive"}
MiB = 1 << 20
Inputs = tuple[tuple, dict]


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def kernel_cases(plan: Plan) -> dict[str, tuple[str, Callable[[torch.dtype], Inputs]]]:
    """label -> (op, dtype -> (args, kwargs) on the plan's device), at the plan's shapes."""
    dev = plan.device
    r, q, g, lp = plan.rmsnorm, plan.rope, plan.router, plan.logprobs

    def rmsnorm(dtype: torch.dtype) -> Inputs:
        x, res = _randn(r["rows"], r["width"], seed=0), _randn(r["rows"], r["width"], seed=1)
        w = 1 + 0.1 * _randn(r["width"], seed=2)
        return (x.to(dev, dtype), w.to(dev, dtype), 1e-6, res.to(dev, dtype)), {}

    def rope(dtype: torch.dtype) -> Inputs:
        x = _randn(q["tokens"], q["heads"], q["head_dim"], seed=0).to(dev, dtype)
        pos = torch.randint(0, 32768, (q["tokens"],), generator=torch.Generator().manual_seed(1)).to(dev)
        return (x, pos), dict(theta=1e6, rotary_dim=q["head_dim"], style="neox")

    def router(experts: int) -> Callable[[torch.dtype], Inputs]:
        return lambda dtype: ((_randn(g["tokens"], experts, seed=0).to(dev, dtype), g["k"]), {})

    def logprobs(dtype: torch.dtype) -> Inputs:
        h = _randn(lp["tokens"], lp["hidden"], seed=0).to(dev, dtype)
        w = (_randn(lp["vocab"], lp["hidden"], seed=1) / lp["hidden"] ** 0.5).to(dev, dtype)
        t = torch.randint(0, lp["vocab"], (lp["tokens"],), generator=torch.Generator().manual_seed(2)).to(dev)
        return (h, w, t), {}

    cases = {f"rmsnorm {r['rows']}x{r['width']} +residual": ("rmsnorm", rmsnorm),
             f"rope {q['tokens']}x{q['heads']}x{q['head_dim']}": ("rope", rope)}
    cases.update({f"router top-{g['k']} of {e}, {g['tokens']} tokens": ("router_topk", router(e))
                  for e in g["experts"]})
    cases[f"logprobs {lp['tokens']}x{lp['hidden']}, V={lp['vocab']}"] = ("logprobs", logprobs)
    return cases


def _outputs(value: object) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def compare(got: object, want: object) -> dict[str, float]:
    """Worst error over a variant's outputs: max |diff|, max ulps (in the output's dtype, at each
    reference value's magnitude floored at 1/1000 of the output's largest: near-zero results of a
    cancellation have meaningless ulps) and, for integer outputs (router expert ids), the number of
    entries that differ."""
    err = {"max_abs": 0.0, "max_ulp": 0.0}
    for a, b in zip(_outputs(got), _outputs(want), strict=True):
        if a.is_floating_point():
            err["max_abs"] = max(err["max_abs"], float((a.double() - b.double()).abs().max()))
            err["max_ulp"] = max(err["max_ulp"], max_ulps(a, b, a.dtype, floor_rel=1e-3))
        else:
            err["int_mismatches"] = err.get("int_mismatches", 0) + int((a != b).sum())
    return err


def copy_gbs(plan: Plan) -> float:
    """GB/s of a device-to-device copy of ``plan.copy_mib`` MiB (read + write counted)."""
    src = torch.empty(plan.copy_mib * MiB, dtype=torch.uint8, device=plan.device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), plan.repeats, _sync(plan.device))
    return 2 * src.nbytes / ms / 1e6


def measure(op: str, args: tuple, kwargs: dict, plan: Plan) -> dict[str, float]:
    """Errors of the Triton kernel against the twin, and the three timings (ms)."""
    triton = kernels.get(op, "triton")
    twin = kernels.get(op, kernels.TORCH_TWIN[op])
    compiled = torch.compile(kernels.get(op, COMPILED[op]), backend=plan.compile_backend, dynamic=False)
    sync = _sync(plan.device)
    with torch.no_grad(), kernels.trusted():
        got = triton(*args, **kwargs)
        row = compare(got, twin(*args, **kwargs))
        moved = sum(t.nbytes for t in (*args, *_outputs(got)) if isinstance(t, torch.Tensor))
        for name, fn in {"triton": triton, "eager": twin, "compiled": compiled}.items():
            row[f"{name}_ms"] = _median_ms(lambda fn=fn: fn(*args, **kwargs), plan.repeats, sync)
    row["triton_GBps"] = moved / row["triton_ms"] / 1e6
    return row


def kernels_stage(plan: Plan, rec: Recorder) -> None:
    """Every case in bf16 and fp32; a case that fails is reported and the others still run. The
    logprob kernel is a GEMM, bound by arithmetic: its share of the copy bandwidth is low by nature."""
    yardstick = copy_gbs(plan)
    rec.put("copy_GBps", yardstick)
    for label, (op, make) in kernel_cases(plan).items():
        for dtype in (torch.bfloat16, torch.float32):
            key = f"{label} {str(dtype).removeprefix('torch.')}"

            def run(op=op, make=make, dtype=dtype, key=key) -> None:
                args, kwargs = make(dtype)
                row = measure(op, args, kwargs, plan)
                row["triton_pct_of_copy"] = 100 * row["triton_GBps"] / yardstick
                for name, value in row.items():
                    rec.put(f"{key}: {name}", value)

            rec.attempt(key, run)


def logprob_memory(plan: Plan, rec: Recorder) -> None:
    """Peak extra memory of forward + backward (bench_kernels' measure: CUDA allocator stats on
    the card, the peak RSS of a fresh process on CPU) of naive, chunked and triton."""
    m = plan.logprob_memory
    rec.put("shape", f"N={m['n']} H={m['hidden']} V={m['vocab']} {m['dtype']}")
    peaks = {}
    for variant in ("naive", "chunked", "triton"):
        peaks[variant] = peak_extra_bytes(variant, m["n"], m["hidden"], m["vocab"], m["dtype"], plan.device)
        rec.put(f"{variant}_peak_MiB", peaks[variant] / MiB)
    for variant in ("chunked", "triton"):  # NaN where naive left no trace (RSS at tiny sizes)
        rec.put(f"{variant}_vs_naive", peaks[variant] / peaks["naive"] if peaks["naive"] > 0 else math.nan)
