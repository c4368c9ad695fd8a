"""Throughput of ``aligntools.compare`` in GB/s of captured data, against the memory roofline.

    .venv/bin/python benchmarks/bench_compare.py [--tokens 4096 --layers 2 --hidden 2048 --vocab 4096 --repeats 3]

Builds a synthetic capture pair in memory (default ~1.1 GB: every per-layer site of a
``--layers``-layer model of width ``--hidden`` plus logits over ``--vocab``), then, in the same
run, measures

- the roofline: a plain reduction (``torch.sum``, and numpy's for one thread) over exactly the
  bytes compare reads - both captures' arrays - with 1 and 2 threads;
- a full ``compare`` (all metrics, logits KL/logprobs/top-1, divergence) with ``workers`` 1
  and 2, and the logits site alone (and the hidden-state sites alone), each on the compiled
  row kernels and on the numpy path they replace (the same-run baseline: same bits);

and prints each throughput as a percentage of the roofline with the same thread count, best
of ``--repeats``. The box is shared: the 1-min load average is printed before and after, and
only same-run ratios mean anything when it is above ~1.2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aligntools  # noqa: E402
from aligntools import sites as S  # noqa: E402
from aligntools.analyzer import compiled_metrics  # noqa: E402
from aligntools.analyzer.metrics import ddot_order  # noqa: E402
from labs import machine  # noqa: E402

KINDS = ("attn_norm", "q", "k", "v", "attn_out", "resid_mid", "mlp_norm", "mlp_out", "resid_post")
THREADS = (1, 2)


def build_pair(tokens: int, layers: int, hidden: int, vocab: int, seed: int = 0) -> tuple[xr.Dataset, xr.Dataset]:
    """Two captures in the contract layout; b = a + 1e-3 relative noise at every site."""
    rng = np.random.default_rng(seed)
    width = {"hidden": hidden, "q_dim": hidden, "kv_dim": hidden // 4, "vocab": vocab}
    sites = [f"L{i}.{k}" for i in range(layers) for k in KINDS] + ["logits"]
    a, b = {}, {}
    for site in sites:
        dims = ("token", *S.trailing_dims(site))
        x = rng.standard_normal((tokens, width[dims[1]]), dtype=np.float32)
        a[site] = (dims, x, {"dtype": "float32"})
        b[site] = (dims, x + np.float32(1e-3) * rng.standard_normal(x.shape, dtype=np.float32), {"dtype": "float32"})
    coords = {"request": ("token", np.zeros(tokens, np.int64)), "position": ("token", np.arange(tokens)),
              "token_id": ("token", rng.integers(0, vocab, tokens)), "step": ("token", np.zeros(tokens, np.int64))}
    attrs = {"engine": "hf", "mode": "tensor", "dtype": "float32"}
    return xr.Dataset(a, coords=coords, attrs=attrs), xr.Dataset(b, coords=coords, attrs=attrs)


def nbytes(*datasets: xr.Dataset) -> int:
    return sum(int(v.nbytes) for ds in datasets for v in ds.data_vars.values())


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bandwidth(datasets: tuple[xr.Dataset, ...], threads: int, repeats: int, engine: str = "torch") -> float:
    """GB/s of a plain sum over every data variable of ``datasets`` (the bytes compare reads)
    with ``threads`` threads: the memory roofline compare is measured against."""
    arrays = [np.asarray(v.values) for ds in datasets for v in ds.data_vars.values()]
    if engine == "numpy":
        sec = best_seconds(lambda: [x.sum() for x in arrays], repeats)
    else:
        tensors = [torch.from_numpy(x) for x in arrays]
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            sec = best_seconds(lambda: [t.sum() for t in tensors], repeats)
        finally:
            torch.set_num_threads(old)
    return sum(x.nbytes for x in arrays) / sec / 1e9


def report(label: str, a: xr.Dataset, b: xr.Dataset, roof: dict[int, float], repeats: int) -> None:
    """compare(a, b) with 1 and 2 worker threads, on the compiled kernels and on the numpy
    path (the baseline, same run): GB/s, % of the roofline of that many threads, speed-up."""
    size = nbytes(a, b)
    for workers in THREADS:
        gbs = {}
        for path in ("1", "0"):
            os.environ[compiled_metrics.ENV_SWITCH] = path
            sec = best_seconds(lambda: aligntools.compare(a, b, workers=workers).first_divergence, repeats)
            gbs[path] = size / sec / 1e9
        os.environ.pop(compiled_metrics.ENV_SWITCH)
        print(f"{label}, {workers} thread(s): {gbs['1']:.2f} GB/s = {gbs['1'] / roof[workers]:.0%} of roofline "
              f"(numpy path {gbs['0']:.2f} GB/s: {gbs['1'] / gbs['0']:.2f}x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
    a, b = build_pair(args.tokens, args.layers, args.hidden, args.vocab)
    print(f"capture pair: {nbytes(a, b) / 1e9:.2f} GB, {len(a.data_vars)} sites x {args.tokens} tokens, "
          f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores")
    roof = {n: bandwidth((a, b), n, args.repeats) for n in THREADS}
    print(f"roofline (sum over both captures): numpy 1 thread {bandwidth((a, b), 1, args.repeats, 'numpy'):.1f} GB/s, "
          + ", ".join(f"torch {n} thread(s) {roof[n]:.1f} GB/s" for n in THREADS))
    order = ddot_order()
    names = {v: k for k, v in compiled_metrics.kernels().DDOT_ORDERS.items()}
    print(f"CPU: {machine.cpu_model()} ({machine.cpu_class()}, OpenBLAS {machine.openblas_core()}); compare's path: "
          + (f"compiled, {names[order]} ddot order" if order is not None else "numpy (no compiled order agrees)"))
    hidden = [s for s in a.data_vars if s != "logits"]
    report("compare, all sites", a, b, roof, args.repeats)
    report("  logits only (+ KL, logprobs, top-1)", a[["logits"]], b[["logits"]], roof, args.repeats)
    report("  hidden-state sites only", a[hidden], b[hidden], roof, args.repeats)
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
