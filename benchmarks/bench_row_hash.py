"""Stats mode's row hash on the benchmark model's site shapes, against what it replaced.

    .venv/bin/python benchmarks/bench_row_hash.py [--rows 512 --widths 512 1376 8192 --repeats 200]

For each row width, in one run with interleaved repeats (medians):

- ``stats pass (sums + hash)``: ``compiled_row_stats.row_sums``, the pass stats mode runs per site;
- ``hash alone``: ``row_hash`` (the compiled NH kernel, for rows the fused pass does not take);
- ``int8 GEMM, 8 lanes``: the product the previous hash was built on (``torch._int_mm`` of the
  row bytes with an int8 [bytes, 8] matrix, torch's threads), i.e. the baseline;
- ``read the bytes``: torch's float32 row sums over the same values (its threads): the
  roofline of a cache-warm read, as in the hook, where the engine has just written the rows.

The fused pass's cost of the hash is its time minus the sums' time; the sums alone are not
timed separately because they only exist fused now (the previous commit's ``row_sums``:
see docs/measurements/tracker-overhead.md "The row hash").
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_tracker import timed  # interleaved repeats, shared with the Tracker benchmark

from aligntools.tracker import row_hash, compiled_row_stats


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--widths", type=int, nargs="+", default=[512, 1376, 8192])
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    out = {}
    print(f"{args.rows} float32 rows per width; torch threads={torch.get_num_threads()}; medians")
    for width in args.widths:
        x = torch.randn(args.rows, width, generator=torch.Generator().manual_seed(width))
        data = x.view(torch.int8)  # [rows, 4 * width]
        lanes = torch.randint(-127, 128, (data.shape[1], 8), dtype=torch.int8)
        keys = row_hash.keys(width)
        times = timed({
            "stats pass (sums + hash)": lambda: compiled_row_stats.row_sums(x, keys),
            "hash alone": lambda: row_hash.row_hash(x),
            "int8 GEMM, 8 lanes (baseline)": lambda: torch._int_mm(data, lanes),
            "read the bytes (roofline)": lambda: x.sum(1),
        }, args.repeats)
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        base = medians["int8 GEMM, 8 lanes (baseline)"]
        print(f"width {width} ({x.numel() * 4 / 2**20:.1f} MiB)")
        for name, sec in medians.items():
            print(f"  {name:32s} {sec * 1e3:8.3f} ms  {x.numel() * 4 / sec / 1e9:6.1f} GB/s  "
                  f"{sec / base:5.2f}x the baseline")
        out[width] = medians
    return out


if __name__ == "__main__":
    main()
