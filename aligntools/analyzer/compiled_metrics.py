"""The compiled path of ``metrics.chunk_metrics``: when it applies and its per-thread scratch.

Why a separate path and not a replacement: the compiled kernels (``numba_reductions``) copy the
rounding order of the numpy/BLAS calls, and that order depends on the OpenBLAS kernel this
machine's CPU gets (``numba_reductions.DDOT_ORDERS``); ``metrics.ddot_order`` checks each order
against numpy on probe rows once per process and uses the one whose every bit agrees. The
numpy path stays the definition of the numbers - and the path for everything the kernels do
not cover: inputs other than float32, rows with NaN/Inf (masked by numpy), and widths whose
dot products numpy computes with ``einsum``.

The kernels compile on first use (numba, cached on disk), so captures smaller than
``MIN_BYTES`` stay on numpy: there the compile would cost more than it saves.
"""

from __future__ import annotations

import os
from functools import cache
from types import ModuleType

import numpy as np

MIN_BYTES = 32 << 20
"""Captured bytes (both sides, all sites) from which ``compare`` uses the compiled path."""

CHUNK_ELEMS = 1 << 17
"""Elements per chunk of a site the kernels take (``metrics.CHUNK_ELEMS`` is for numpy's):
the kernels keep one row in cache, not the chunk, so only the logits' float64 exp scratch
(1 MiB here) bounds it; measured on the 2-core box, 2 threads, bench_compare: 5.1 GB/s at
2**16, 6.1 at 2**17 and 2**18 (logits 1.7 / 2.2 / 2.3)."""

ENV_SWITCH = "MLAB_COMPILED_COMPARE"
"""Set to 0 to keep every comparison on the numpy path (e.g. to time it, or where numba
cannot compile); 1 forces the compiled path whatever the size (tests)."""

N_SUMS = 8
"""Rows of ``row_sums``' output: sum_d2, sum_a2, sum_b2, sum_ab, sum_absd, max_absd, n_rel,
max_ulp (``metrics.ROW_SUMS`` order)."""


def wanted(nbytes: int) -> bool:
    """Whether a comparison of ``nbytes`` captured bytes should try the compiled path."""
    switch = os.environ.get(ENV_SWITCH, "")
    if switch in ("0", "1"):
        return switch == "1"
    return nbytes >= MIN_BYTES


def takes(dtype_a: np.dtype, dtype_b: np.dtype, width: int, dot_block: int) -> bool:
    """Whether the kernels compute a site's rows exactly as numpy does: float32 on both
    sides, dot products by BLAS (``dot_block`` >= 256, or the whole row), rows not empty."""
    return (dtype_a == np.float32 and dtype_b == np.float32 and width > 0
            and (dot_block >= 256 or dot_block == width))


def covers(xa: np.ndarray, xb: np.ndarray, dot_block: int) -> bool:
    """``takes`` for chunk rows xa, xb [r, D], which must also be in C order."""
    return (takes(xa.dtype, xb.dtype, xa.shape[1], dot_block)
            and xa.flags.c_contiguous and xb.flags.c_contiguous)


@cache
def kernels() -> ModuleType:
    """``numba_reductions``, imported (and numba with it) on first use."""
    from aligntools.analyzer import numba_reductions

    return numba_reductions


class Scratch:
    """One thread's scratch for the kernels, grown on demand and reused, and the ``ddot``
    order (``numba_reductions.DDOT_ORDERS``) this machine's numpy rounds in."""

    def __init__(self, order: int) -> None:
        self.order = order
        self._f64 = np.empty(0)
        self._ez = np.empty(0)
        self._out = np.empty((N_SUMS, 0))
        self.ints = np.empty(256, np.int64)

    def row(self, width: int, dot_block: int) -> np.ndarray:
        need = width + 4 * (width // dot_block) + 192  # numba_reductions.row_sums_fp32's layout
        if self._f64.size < need:
            self._f64 = np.empty(need)
        return self._f64[:need]

    def ez(self, rows: int, width: int) -> np.ndarray:
        """float64 [rows, width] for the logits' exp(x - max)."""
        if self._ez.size < rows * width:
            self._ez = np.empty(rows * width)
        return self._ez[:rows * width].reshape(rows, width)

    def out(self, rows: int) -> np.ndarray:
        if self._out.shape[1] < rows:
            self._out = np.empty((N_SUMS, rows))
        return self._out[:, :rows]


def row_sums(xa: np.ndarray, xb: np.ndarray, dot_block: int, permille: float, scratch: Scratch) -> np.ndarray | None:
    """``ROW_SUMS`` of float32 rows xa, xb [r, D] as [8, r] (``N_SUMS`` order); None when
    the rows hold NaN/Inf (the caller takes the numpy path)."""
    out = scratch.out(len(xa))
    ok = kernels().row_sums_fp32(xa, xb, dot_block, permille, scratch.row(xa.shape[1], dot_block),
                                 scratch.ints, out, scratch.order, kernels().ZERO)
    return out if ok else None


def logit_dots(ez: np.ndarray, xa: np.ndarray, xb: np.ndarray, dot_block: int, scratch: Scratch) -> np.ndarray:
    """Per-row dot of ``ez`` [r, V] float64 with ``xb - xa`` (float32 rows widened) [r]."""
    out = np.empty(len(ez))
    kernels().diff_dots(ez, xa, xb, dot_block, scratch.row(xa.shape[1], dot_block), out, scratch.order, kernels().ZERO)
    return out
