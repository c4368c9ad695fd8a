"""pytest-benchmark timing of ``aligntools.analyzer.comparison`` on a synthetic capture pair (~70 MB).

    .venv/bin/python -m pytest benchmarks/test_bench_compare.py --benchmark-enable -q

The GB/s figure for the README comes from ``bench_compare.py`` (~1 GB pair, with the memory
roofline measured in the same run); this keeps a small, repeatable timing in the benchmark
report, with the roofline of the same bytes and thread count next to it, and checks the
result is sane.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aligntools  # noqa: E402
from bench_compare import bandwidth, build_pair, nbytes  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    return build_pair(tokens=512, layers=2, hidden=1024, vocab=4096)


@pytest.mark.parametrize("workers", [1, 2])
def test_compare_throughput(benchmark, pair, workers):
    a, b = pair
    benchmark.group = "aligntools.analyzer.comparison"
    benchmark.extra_info["bytes"] = nbytes(a, b)
    benchmark.extra_info["roofline_gb_per_s"] = round(bandwidth((a, b), workers, repeats=3), 1)
    cmp = benchmark(aligntools.compare, a, b, workers=workers)
    assert cmp.table["rel_l2"].between(5e-4, 2e-3).all()  # the planted 1e-3 relative noise
    assert cmp.first_divergence is not None and cmp.first_divergence.site == "L0.attn_norm"
