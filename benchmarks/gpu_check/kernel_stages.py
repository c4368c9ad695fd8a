"""Stages: each Triton kernel against the torch implementation of the same variant, the fused
logprobs against the anchors a user would pick instead, and the fused logprobs' peak memory.

A variant names numerics; ``kernels.get(op, variant, impl="triton")`` and ``impl="torch"`` compute
the same numbers up to reduction order (the CPU interpreter tests hold them to it). Each case
measures one variant per op (``VARIANTS``: the numerics issue #36's first card run measured):
errors of the Triton implementation against the torch one, and the median of ``plan.repeats``
calls of the Triton implementation, the torch one in eager mode and the torch one under
``torch.compile``. For logprobs the compiled baseline is the ``naive`` variant (full logits,
``log_softmax`` + gather): the torch ``chunked`` Python loop would unroll into one graph per
chunk, and the full-logits compile is what issue #36 asks the kernel to beat. Bandwidth counts
the bytes of every input and output once (the least any kernel must move) and is given as a
share of a device-to-device copy of ``plan.copy_mib`` and of a same-size clone, both timed in the
same run.

Anchors (``logprob_anchors``): Liger-Kernel's fused linear cross-entropy and Apple's Cut
Cross-Entropy, both with ``reduction="none"`` (their per-token loss is ``-logprob``; neither gives
the entropy), beside our Triton ``chunked`` and the compiled ``naive``: forward and forward +
backward times and, on CUDA, the peak memory beyond the inputs and their gradients. They run on
CUDA only (Triton kernels without an interpreter path); elsewhere the stage records why they
were skipped.

Goals (issue #36, items 3 and 4) are computed from those numbers and recorded as
``goal ...`` -> True / False (met / missed) with the measured value beside them, or a
``not measured: ...`` reason; nothing is asserted. In the dry run they are computed from CPU
interpreter timings and mean nothing beyond "the code runs".
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import math
from typing import Callable

import torch

import kernels
from benchmarks.bench_kernels import _median_ms, peak_extra_bytes
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.runner import Recorder
from tests.kernels.kernels_testutil import max_ulps

#: op -> the variant whose Triton and torch implementations each case compares.
VARIANTS = {"rmsnorm": "reference", "rope": "fp32_compute", "router_topk": "stable", "logprobs": "chunked"}
#: op -> the variant whose torch implementation is compiled as the baseline (see the docstring).
COMPILED = {**VARIANTS, "logprobs": "naive"}
#: The anchors: distribution name -> importable module.
ANCHORS = {"liger-kernel": "liger_kernel", "cut-cross-entropy": "cut_cross_entropy"}
#: Issue #36's goals.
RMSNORM_PCT = {"large": 80.0, "square": 60.0}  # % of same-size clone bandwidth, bf16
ROPE_PCT = 50.0
LOGPROB_PEAK_MIB = 64.0
MiB = 1 << 20
Inputs = tuple[tuple, dict]


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _short(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, _dtype_name(dtype))


def _rmsnorm_inputs(rows: int, width: int, dev: str) -> Callable[[torch.dtype], Inputs]:
    def make(dtype: torch.dtype) -> Inputs:
        x, res = _randn(rows, width, seed=0), _randn(rows, width, seed=1)
        w = 1 + 0.1 * _randn(width, seed=2)
        return (x.to(dev, dtype), w.to(dev, dtype), 1e-6, res.to(dev, dtype)), {}

    return make


def kernel_cases(plan: Plan) -> dict[str, tuple[str, Callable[[torch.dtype], Inputs]]]:
    """label -> (op, dtype -> (args, kwargs) on the plan's device), at the plan's shapes."""
    dev = plan.device
    r, q, g, lp = plan.rmsnorm, plan.rope, plan.router, plan.logprobs

    def rope(dtype: torch.dtype) -> Inputs:
        x = _randn(q["tokens"], q["heads"], q["head_dim"], seed=0).to(dev, dtype)
        pos = torch.randint(0, 32768, (q["tokens"],), generator=torch.Generator().manual_seed(1)).to(dev)
        return (x, pos), dict(theta=1e6, rotary_dim=q["head_dim"], style="neox")

    def router(experts: int) -> Callable[[torch.dtype], Inputs]:
        return lambda dtype: ((_randn(g["tokens"], experts, seed=0).to(dev, dtype), g["k"]), {})

    def logprobs(dtype: torch.dtype) -> Inputs:
        return _logprob_inputs(lp["tokens"], lp["hidden"], lp["vocab"], dtype, dev), {}

    cases = {f"rmsnorm {r['rows']}x{r['width']} +residual": ("rmsnorm", _rmsnorm_inputs(r["rows"], r["width"], dev)),
             f"rope {q['tokens']}x{q['heads']}x{q['head_dim']}": ("rope", rope)}
    cases.update({f"router top-{g['k']} of {e}, {g['tokens']} tokens": ("router_topk", router(e))
                  for e in g["experts"]})
    cases[f"logprobs {lp['tokens']}x{lp['hidden']}, V={lp['vocab']}"] = ("logprobs", logprobs)
    return cases


def _logprob_inputs(n: int, hidden: int, vocab: int, dtype: torch.dtype, dev: str) -> tuple[torch.Tensor, ...]:
    h = _randn(n, hidden, seed=0).to(dev, dtype)
    w = (_randn(vocab, hidden, seed=1) / hidden**0.5).to(dev, dtype)
    t = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(2)).to(dev)
    return h, w, t


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


def clone_ms(moved: int, plan: Plan) -> float:
    """Median ms of cloning a tensor of ``moved / 2`` bytes: it reads and writes ``moved`` bytes,
    what the kernel moves at least, so ``clone_ms / kernel_ms`` is its share of that bandwidth."""
    src = torch.empty(max(moved // 2, 1), dtype=torch.uint8, device=plan.device)
    return _median_ms(src.clone, plan.repeats, _sync(plan.device))


@functools.cache
def _compiled(op: str, variant: str, backend: str) -> Callable:
    """One ``torch.compile`` wrapper per torch implementation, shared by the cases and the anchors:
    a shape, dtype and grad mode compiled once is not compiled again (the card's budget), and no
    wrapper reaches dynamo's recompile limit (8) with the plan's shapes."""
    return torch.compile(kernels.get(op, variant, impl="torch"), backend=backend, dynamic=False)


def _moved(args: tuple, out: object) -> int:
    return sum(t.nbytes for t in (*args, *_outputs(out)) if isinstance(t, torch.Tensor))


def measure(op: str, args: tuple, kwargs: dict, plan: Plan) -> dict[str, float]:
    """Errors of the Triton implementation of ``VARIANTS[op]`` against its torch one, the three
    timings (ms), and the Triton one's bandwidth against a same-size clone."""
    triton = kernels.get(op, VARIANTS[op], impl="triton")
    torch_impl = kernels.get(op, VARIANTS[op], impl="torch")
    compiled = _compiled(op, COMPILED[op], plan.compile_backend)
    sync = _sync(plan.device)
    with torch.no_grad(), kernels.trusted():
        got = triton(*args, **kwargs)
        row = compare(got, torch_impl(*args, **kwargs))
        moved = _moved(args, got)
        for name, fn in {"triton": triton, "eager": torch_impl, "compiled": compiled}.items():
            row[f"{name}_ms"] = _median_ms(lambda fn=fn: fn(*args, **kwargs), plan.repeats, sync)
    row["triton_GBps"] = moved / row["triton_ms"] / 1e6
    row["clone_ms"] = clone_ms(moved, plan)
    row["triton_pct_of_clone"] = 100 * row["clone_ms"] / row["triton_ms"]
    return row


def bandwidth(op: str, args: tuple, kwargs: dict, plan: Plan) -> dict[str, float]:
    """Only the Triton implementation's time and its share of a same-size clone (a goal's extra shape)."""
    triton = kernels.get(op, VARIANTS[op], impl="triton")
    with torch.no_grad(), kernels.trusted():
        moved = _moved(args, triton(*args, **kwargs))
        ms = _median_ms(lambda: triton(*args, **kwargs), plan.repeats, _sync(plan.device))
    row = {"triton_ms": ms, "triton_GBps": moved / ms / 1e6, "clone_ms": clone_ms(moved, plan)}
    row["triton_pct_of_clone"] = 100 * row["clone_ms"] / ms
    return row


def kernels_stage(plan: Plan, rec: Recorder) -> None:
    """Every case in bf16 and fp32, the RMSNorm bandwidth shapes, the logprob anchors, then the
    goals; a case that fails is reported and the others still run. The logprob kernel is a GEMM,
    bound by arithmetic: its share of the copy bandwidth is low by nature."""
    yardstick = copy_gbs(plan)
    rec.put("copy_GBps", yardstick)
    rec.put("variants", ", ".join(f"{op}={v}" for op, v in VARIANTS.items()))
    rows: dict[str, dict[str, float]] = {}  # "<label> <dtype>" -> row
    for label, (op, make) in kernel_cases(plan).items():
        for dtype in (torch.bfloat16, torch.float32):
            key = f"{label} {_dtype_name(dtype)}"

            def run(op=op, make=make, dtype=dtype, key=key) -> None:
                args, kwargs = make(dtype)
                row = measure(op, args, kwargs, plan)
                row["triton_pct_of_copy"] = 100 * row["triton_GBps"] / yardstick
                rows[key] = row
                for name, value in row.items():
                    rec.put(f"{key}: {name}", value)

            rec.attempt(key, run)
    r = plan.rmsnorm
    for extra in r.get("bandwidth_rows", []):
        key = f"rmsnorm {extra}x{r['width']} +residual bfloat16 (bandwidth only)"

        def run_bw(extra=extra, key=key) -> None:
            args, kwargs = _rmsnorm_inputs(extra, r["width"], plan.device)(torch.bfloat16)
            rows[key] = bandwidth("rmsnorm", args, kwargs, plan)
            for name, value in rows[key].items():
                rec.put(f"{key}: {name}", value)

        rec.attempt(key, run_bw)
    anchors = logprob_anchors(plan, rec)
    goals(plan, rows, anchors, rec)


# ---------------------------------------------------------------- the logprob anchors


def anchor_available(dist: str, device: str) -> str | None:
    """None when the anchor can run here, else why not."""
    if device != "cuda":
        return "CUDA only"
    if importlib.util.find_spec(ANCHORS[dist]) is None:
        return f"{dist} not installed"
    return None


def _liger(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Liger-Kernel's fused linear cross-entropy, per token: ``-logprob``."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(h, w, t, reduction="none")


def _cce(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Apple's Cut Cross-Entropy, per token: ``-logprob``."""
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(h, w, t, reduction="none")


def _loss(out: object) -> torch.Tensor:
    """What forward + backward differentiates: ours (logprob, entropy) as an RL loss would
    (``logprob + 0.1 entropy``, as bench_kernels), an anchor's per-token loss summed."""
    if isinstance(out, tuple):
        lp, ent = out
        return lp.sum() + 0.1 * ent.sum()
    return out.sum()


def _neg_logprob(out: object) -> torch.Tensor:
    return -out[0] if isinstance(out, tuple) else out


def _release() -> None:
    """Free what a shape left in the CUDA caching allocator before the next one (the 8192-row
    compile holds gigabytes of full logits)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _peak_beyond_grads(fn: Callable, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> float:
    """CUDA bytes at the peak of one forward + backward beyond the inputs and their gradients."""
    h.grad = w.grad = None
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _loss(fn(h, w, t)).backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base - h.grad.nbytes - w.grad.nbytes
    h.grad = w.grad = None
    return float(peak)


def logprob_anchors(plan: Plan, rec: Recorder) -> dict[str, dict[str, object]]:
    """Per ``plan.logprobs["anchor_shapes"]`` entry (tokens, hidden, dtype) at the plan's vocabulary:
    ours (Triton ``chunked``), ``torch.compile`` of ``naive``, Liger, CCE. Forward (no grad) and
    forward + backward ms, peak MiB beyond inputs and gradients (CUDA), and each one's max
    |logprob difference| against the torch ``chunked``. Returns shape label -> impl -> metric."""
    lp = plan.logprobs
    sync = _sync(plan.device)
    skipped = {dist: anchor_available(dist, plan.device) for dist in ANCHORS}
    for dist, why in skipped.items():
        rec.put(f"anchor {dist}", f"skipped: {why}" if why else "measured")
    results: dict[str, dict[str, object]] = {}
    for n, hidden, dtype_name in lp.get("anchor_shapes", []):
        dtype = getattr(torch, dtype_name)
        shape = f"logprobs {n}x{hidden}, V={lp['vocab']} {_short(dtype)}"
        impls: dict[str, Callable] = {"ours": kernels.get("logprobs", "chunked", impl="triton"),
                                      "compile": _compiled("logprobs", "naive", plan.compile_backend)}
        if not skipped["liger-kernel"]:
            impls["liger"] = _liger
        if not skipped["cut-cross-entropy"]:
            impls["cce"] = _cce
        results[shape] = {}

        def run(shape=shape, n=n, hidden=hidden, dtype=dtype, impls=impls) -> None:
            h, w, t = _logprob_inputs(n, hidden, lp["vocab"], dtype, plan.device)
            with torch.no_grad(), kernels.trusted():
                want = -kernels.get("logprobs", "chunked", impl="torch")(h, w, t)[0].double()
            hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
            for name, fn in impls.items():
                try:
                    with kernels.trusted():  # our argument checks out of the timings, as in measure()
                        m = _anchor_row(fn, h, w, t, hg, wg, want, plan, sync)
                except Exception as exc:  # noqa: BLE001  (a failing anchor is a finding, not our failure)
                    if name in ("ours", "compile"):
                        raise
                    m = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                results[shape][name] = m
                for metric, value in m.items():
                    rec.put(f"{shape}: {name} {metric}", value)
            del h, w, hg, wg, want
            _release()

        rec.attempt(shape, run)
    return results


def _anchor_row(fn: Callable, h, w, t, hg, wg, want: torch.Tensor, plan: Plan, sync) -> dict[str, object]:
    with torch.no_grad():
        got = _neg_logprob(fn(h, w, t)).double()
        row: dict[str, object] = {"max_abs_vs_torch": float((got - want).abs().max())}
        row["fwd_ms"] = _median_ms(lambda: fn(h, w, t), plan.repeats, sync)

    def fwd_bwd() -> None:
        hg.grad = wg.grad = None
        _loss(fn(hg, wg, t)).backward()

    row["fwd_bwd_ms"] = _median_ms(fwd_bwd, plan.repeats, sync)
    row["peak_MiB"] = _peak_beyond_grads(fn, hg, wg, t) / MiB if plan.device == "cuda" else "skipped: CUDA only"
    hg.grad = wg.grad = None
    return row


# ---------------------------------------------------------------- issue #36's goals


def goals(plan: Plan, rows: dict[str, dict[str, float]], anchors: dict[str, dict[str, object]],
          rec: Recorder) -> None:
    """Record each goal as ``goal <what>`` -> True (met) / False (missed) with the measured value
    beside it (``goal <what>: <unit>``), or ``not measured: <why>``; then ``goals met`` as "k of n"."""
    verdicts: list[bool] = []

    def put(what: str, met: bool | None, value: object, unit: str = "", why: str = "") -> None:
        if met is None:
            rec.put(f"goal {what}", f"not measured: {why}")
            return
        verdicts.append(bool(met))
        rec.put(f"goal {what}", bool(met))
        rec.put(f"goal {what}: {unit}", value)

    def row(prefix: str, suffix: str) -> dict[str, float] | None:
        return next((v for k, v in rows.items() if k.startswith(prefix) and k.endswith(suffix)), None)

    r, q, g = plan.rmsnorm, plan.rope, plan.router
    square = row(f"rmsnorm {r['rows']}x{r['width']} ", "bfloat16")
    put(f"rmsnorm {r['rows']}x{r['width']} bf16 >= {RMSNORM_PCT['square']:.0f} % of clone bandwidth",
        None if square is None else square["triton_pct_of_clone"] >= RMSNORM_PCT["square"],
        None if square is None else square["triton_pct_of_clone"], "%", "the case failed")
    for extra in r.get("bandwidth_rows", []):
        big = row(f"rmsnorm {extra}x{r['width']} ", "(bandwidth only)")
        put(f"rmsnorm {extra}x{r['width']} bf16 >= {RMSNORM_PCT['large']:.0f} % of clone bandwidth",
            None if big is None else big["triton_pct_of_clone"] >= RMSNORM_PCT["large"],
            None if big is None else big["triton_pct_of_clone"], "%", "the case failed")
    rope = row(f"rope {q['tokens']}x", "bfloat16")
    put(f"rope {q['tokens']}x{q['heads']}x{q['head_dim']} bf16 >= {ROPE_PCT:.0f} % of clone bandwidth",
        None if rope is None else rope["triton_pct_of_clone"] >= ROPE_PCT,
        None if rope is None else rope["triton_pct_of_clone"], "%", "the case failed")
    for e in g["experts"]:
        for dtype in ("bfloat16", "float32"):
            top = row(f"router top-{g['k']} of {e},", dtype)
            put(f"router top-{g['k']} of {e} {dtype} triton ms <= compile ms",
                None if top is None else top["triton_ms"] <= top["compiled_ms"],
                None if top is None else top["triton_ms"] / top["compiled_ms"], "triton / compile",
                "the case failed")
    for shape, by_impl in anchors.items():
        ours, comp, cce = by_impl.get("ours"), by_impl.get("compile"), by_impl.get("cce")
        if not ours or not comp:
            put(f"{shape} measured", None, None, why="the shape failed")
            continue
        if shape.endswith("bf16"):
            put(f"{shape} forward <= compile", ours["fwd_ms"] <= comp["fwd_ms"], ours["fwd_ms"] / comp["fwd_ms"],
                "ours / compile")
            if cce is None or "error" in cce:
                why = (cce or {}).get("error") or rec.data["metrics"].get("anchor cut-cross-entropy")
                put(f"{shape} fwd+bwd <= CCE with peak <= {LOGPROB_PEAK_MIB:.0f} MiB", None, None, why=str(why))
            else:
                put(f"{shape} fwd+bwd <= CCE with peak <= {LOGPROB_PEAK_MIB:.0f} MiB",
                    ours["fwd_bwd_ms"] <= cce["fwd_bwd_ms"] and ours["peak_MiB"] <= LOGPROB_PEAK_MIB,
                    f"{ours['fwd_bwd_ms'] / cce['fwd_bwd_ms']:.3g}x, {ours['peak_MiB']:.1f} MiB",
                    "ours / CCE time, our peak")
        else:
            put(f"{shape} fwd+bwd <= compile", ours["fwd_bwd_ms"] <= comp["fwd_bwd_ms"],
                ours["fwd_bwd_ms"] / comp["fwd_bwd_ms"], "ours / compile")
    rec.put("goals met", f"{sum(verdicts)} of {len(verdicts)} measured")


# ---------------------------------------------------------------- peak memory


def logprob_memory(plan: Plan, rec: Recorder) -> None:
    """Peak extra memory of forward + backward (bench_kernels' measure: CUDA allocator stats on
    the card, the peak RSS of a fresh process on CPU, gradients included) of naive, chunked and
    chunked's Triton implementation (``triton``)."""
    m = plan.logprob_memory
    rec.put("shape", f"N={m['n']} H={m['hidden']} V={m['vocab']} {m['dtype']}")
    peaks = {}
    for key, label in {"naive": "naive", "chunked": "chunked", "triton": "chunked/triton"}.items():
        peaks[key] = peak_extra_bytes(label, m["n"], m["hidden"], m["vocab"], m["dtype"], plan.device)
        rec.put(f"{key}_peak_MiB", peaks[key] / MiB)
    for key in ("chunked", "triton"):  # NaN where naive left no trace (RSS at tiny sizes)
        rec.put(f"{key}_vs_naive", peaks[key] / peaks["naive"] if peaks["naive"] > 0 else math.nan)
