"""The run log's per-step flush: ``run_log.netcdf_bytes`` against xarray's own ``to_netcdf``, same file.

    .venv/bin/python benchmarks/bench_run_log.py [--metrics 60 --rows 10 200 --repeats 7]

A run rewrites ``metrics.nc`` after every step (crash safety, docs/runs.md), so this cost is paid once per
step; 60 metrics is a GRPO run with the mismatch monitor's scalars. Interleaved repeats, medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

from minirl.training.run_log import netcdf_bytes, to_dataset


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--metrics", type=int, default=60)
    p.add_argument("--rows", type=int, nargs="+", default=[10, 200])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    writers = {"xarray to_netcdf (baseline)": lambda ds: ds.to_netcdf(engine="h5netcdf"), "netcdf_bytes": netcdf_bytes}
    out = {}
    for rows in args.rows:
        ds = to_dataset([{"step": s, **{f"metric_{j}": s + j / 3 for j in range(args.metrics)}} for s in range(rows)])
        times: dict[str, list[float]] = {name: [] for name in writers}
        for _ in range(args.repeats):
            for name, write in writers.items():
                t = time.perf_counter()
                write(ds)
                times[name].append(time.perf_counter() - t)
        out[rows] = {name: statistics.median(ts) for name, ts in times.items()}
        base = out[rows]["xarray to_netcdf (baseline)"]
        for name, s in out[rows].items():
            print(f"{rows:4d} rows x {args.metrics} metrics  {name:28s} {s * 1e3:8.1f} ms  {base / s:5.2f}x")
    return out


if __name__ == "__main__":
    main()
