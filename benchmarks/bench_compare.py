"""Throughput of ``aligntools.analyzer.comparison`` in GB/s of captured data (both captures' bytes).

    .venv/bin/python benchmarks/bench_compare.py [--tokens 4096 --layers 2 --hidden 2048 --vocab 4096 --repeats 3]

Builds a synthetic capture pair in memory (default ~1.1 GB: every per-layer site of a
``--layers``-layer model of width ``--hidden`` plus logits over ``--vocab``), then times a
full ``compare`` (all metrics, logits KL/logprobs, divergence) with 1 and 2 worker threads
and prints the best of ``--repeats``. Goal: >= 1 GB/s on the 2-core CPU box.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aligntools  # noqa: E402
from aligntools import sites as S  # noqa: E402

KINDS = ("attn_norm", "q", "k", "v", "attn_out", "resid_mid", "mlp_norm", "mlp_out", "resid_post")


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


def best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    a, b = build_pair(args.tokens, args.layers, args.hidden, args.vocab)
    size = nbytes(a, b)
    print(f"capture pair: {size / 1e9:.2f} GB, {len(a.data_vars)} sites x {args.tokens} tokens")
    for workers in (1, 2):
        sec = best_seconds(lambda: aligntools.compare(a, b, workers=workers).first_divergence, args.repeats)
        print(f"compare, {workers} worker(s): {sec:.2f} s  ->  {size / sec / 1e9:.2f} GB/s")
    hidden_only = [s for s in a.data_vars if s != "logits"]
    sec = best_seconds(lambda: aligntools.compare(a[hidden_only], b[hidden_only]), args.repeats)
    print(f"  hidden-state sites only: {nbytes(a[hidden_only], b[hidden_only]) / sec / 1e9:.2f} GB/s")
    sec = best_seconds(lambda: aligntools.compare(a[["logits"]], b[["logits"]]), args.repeats)
    print(f"  logits only (+ KL, logprobs, top-1): {nbytes(a[['logits']], b[['logits']]) / sec / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
