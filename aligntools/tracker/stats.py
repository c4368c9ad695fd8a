"""Per-token summaries of a site tensor: what stats mode keeps instead of the tensor.

Why per token and not per site: a mismatch hunt asks "which token diverged first", and a
7B model's full activations do not fit in memory while 8 numbers per token per site do.
The ``hash`` column makes bit-equality checkable without the tensor: two rows with the
same float32 bytes get the same hash on any machine, in any summation order.

Why it is written the way it is: stats mode runs on every site of every forward, so its
cost is the Tracker's overhead, and that cost is per pass over the tensor and per torch
call (on CPU a parallel call can wait for a worker thread). So the work is split in two.
``reduce_rows`` reads the tensor, in the hook while it exists, in a handful of calls:
min/max, both float64 sums and the row hash in one compiled pass that replays torch's
summation order (``compiled_row_stats``; elsewhere min/max in float32, one float64 copy per
cache-sized row block feeding both sums, and ``row_hash``'s own kernel). Tensors under
``row_hash.COMPILED_MIN`` elements take torch's path, so a tiny model never loads numba.
``finish_rows`` does the per-row arithmetic on what was read (amax, the stat columns) once per
flush, for every site in one batch of calls. ``row_stats`` is both, for one tensor.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import torch

from aligntools.tracker.row_hash import COMPILED_MIN, keys, row_hash, torch_row_hash

STAT_NAMES: tuple[str, ...] = ("min", "max", "mean", "l2", "amax", "n_nan", "n_inf", "hash")

_BLOCK = 1 << 18  # elements per float64-summed block on CPU (a 2 MiB temporary)
_LONE_ROW = 1 << 15  # torch's GRAIN_SIZE: a lone row this long is reduced by several threads


@dataclass(frozen=True)
class RowReduction:
    """What ``reduce_rows`` read from a tensor of N rows, for ``finish_rows`` to complete."""

    mn: torch.Tensor  # [N] float32 values (in a float64 tensor from the compiled pass or for rows with NaN/inf)
    mx: torch.Tensor  # [N]
    mean: torch.Tensor  # [N] float64
    l2: torch.Tensor  # [N] float64
    hash: torch.Tensor  # [N] float64 (CPU): ``row_hash`` of each row
    masked: torch.Tensor | None = None  # [N, 3] float64 (amax, n_nan, n_inf) when some entry is NaN/inf

    def __len__(self) -> int:
        return self.mean.shape[0]


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """Summaries of each row of ``x`` [N, ...] -> float64 [N, len(STAT_NAMES)] (on the CPU).

    Values are widened to float32 (the capture's storage dtype), so a stats capture equals
    the stats of the matching tensor capture. ``min/max/mean/l2/amax`` are over the finite
    entries only (NaN where a row has none); ``n_nan``/``n_inf`` count the rest; sums are
    accumulated in float64 (relative error ~1e-16 * sqrt(D)). Integer sites (``topk_ids``)
    are summarised as values and hashed as int64.
    """
    return finish_rows([reduce_rows(x)])[0]


def reduce_rows(x: torch.Tensor) -> RowReduction:
    """The part of ``row_stats`` that reads ``x`` [N, ...]: a few vectorised passes on its
    device, and one host sync (is every entry finite?)."""
    rows = x.detach() if x.dim() == 2 else x.detach().reshape(x.shape[0], -1)  # [N, D]
    # contiguous: torch sums a strided row in another order, and the stats must be those of
    # the same values captured in tensor mode (stored C-contiguous), to the last bit
    flt = (rows if rows.dtype == torch.float32 else rows.to(torch.float32)).contiguous()
    if _compiled_applies(flt):  # the same bits in one pass, hash included (compiled_row_stats)
        from aligntools.tracker import compiled_row_stats

        (mn, mx, total, l2, hashes), flags = compiled_row_stats.row_sums(flt, keys(flt.shape[1]))
        if not rows.is_floating_point():  # integer ids are hashed as int64, not as float32
            hashes = row_hash(rows.to(torch.int64))
        if flags & compiled_row_stats.ZERO_MIN_MAX:  # a zero: its sign depends on torch's order
            mn, mx = flt.amin(1), flt.amax(1)
        finite = not flags & compiled_row_stats.NONFINITE_SUM
    else:
        # separate amin/amax: torch.aminmax is ~50x slower on CPU; both refuse empty rows
        mn, mx = (flt.amin(1), flt.amax(1)) if flt.shape[1] else (flt.sum(1),) * 2  # [N] each
        total, l2 = _sum_l2(flt)
        hashes = row_hash(flt if rows.is_floating_point() else rows.to(torch.int64))
        finite = math.isfinite(total.sum().item())
    # float64 sums of float32 values cannot overflow: a non-finite total means NaN/inf entries
    if finite:
        return RowReduction(mn, mx, total / flt.shape[1], l2, hashes)
    mn, mx, mean, l2, masked = _masked_stats(flt)
    return RowReduction(mn, mx, mean, l2, hashes, masked)


def device_row_stats(x: torch.Tensor) -> torch.Tensor:
    """``row_stats`` of ``x`` [N, ...] as float64 [N, len(STAT_NAMES)] on ``x``'s device, read
    nowhere: no host sync (``pending``). Every row takes the finite-entries path (the CPU
    path's branch on "is every entry finite?" is a host read); for a finite row it gives the
    same stats. Sums follow the device's own order, so they equal the CPU's to rounding,
    while min/max, counts and the hash are exact."""
    rows = x.detach() if x.dim() == 2 else x.detach().reshape(x.shape[0], -1)  # [N, D]
    flt = (rows if rows.dtype == torch.float32 else rows.to(torch.float32)).contiguous()
    mn, mx, mean, l2, masked = _masked_stats(flt)
    hashes = torch_row_hash((flt if rows.is_floating_point() else rows.to(torch.int64)).contiguous().view(torch.int32))
    return torch.cat([torch.stack([mn, mx, mean, l2], dim=1), masked, hashes[:, None]], dim=1)  # [N, 8]


def finish_rows(parts: list[RowReduction]) -> list[torch.Tensor]:
    """float64 [len(part), len(STAT_NAMES)] stats rows of each reduction, on the CPU.

    All parts are finished together (a flush finishes every site's rows), so the per-row
    arithmetic costs a fixed number of torch calls however many sites were captured.
    """
    mn, mx, mean, l2 = (_cat_cpu([getattr(p, name) for p in parts]).double() for name in ("mn", "mx", "mean", "l2"))
    zero = torch.zeros_like(mn)
    tail = torch.stack([torch.maximum(mx.abs(), mn.abs()), zero, zero], dim=1)  # [sum N, 3]: amax, n_nan, n_inf
    start = 0
    for p in parts:
        if p.masked is not None:  # rows with NaN/inf: summaries of their finite entries
            tail[start:start + len(p)] = p.masked.cpu()
        start += len(p)
    hashes = _cat_cpu([p.hash for p in parts])  # [sum N]
    stats = torch.cat([torch.stack([mn, mx, mean, l2], dim=1), tail, hashes[:, None]], dim=1)  # [sum N, 8]
    return list(stats.split([len(p) for p in parts]))


def _cat_cpu(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t if t.is_cpu else t.cpu() for t in tensors])


def _sum_l2(flt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, l2 norm) of each row of float32 ``flt`` [N, D], accumulated in float64.

    One float64 copy of each row block feeds both reductions. On CPU the blocks are about
    ``_BLOCK`` elements: a float64 copy of 32 MiB or more is a fresh mmap that page-faults
    on every call (6-15x slower), a 2 MiB one is reused from the heap and stays in cache.
    Other devices reduce the tensor in one go.
    """
    per = max(1, _BLOCK // max(flt.shape[1], 1)) if flt.is_cpu else max(len(flt), 1)
    if per >= len(flt):
        wide = flt.double()  # [N, D]
        return wide.sum(1), torch.linalg.vector_norm(wide, dim=1)
    sums, norms = zip(*(_sum_l2(block) for block in flt.split(per)))  # views, [per, D] each
    return torch.cat(sums), torch.cat(norms)


def _compiled_applies(flt: torch.Tensor) -> bool:
    """Where ``compiled_row_stats`` gives torch's bits and is worth loading: contiguous float32 rows
    on the CPU shorter than ``_LONE_ROW`` (torch sums a lone longer row in parallel halves), at
    least ``COMPILED_MIN`` elements in all, on a build where the kernel was checked to agree."""
    return (flt.is_cpu and flt.dtype == torch.float32 and 0 < flt.shape[1] < _LONE_ROW
            and flt.numel() >= COMPILED_MIN and flt.is_contiguous() and _kernel_agrees())


@functools.cache
def _kernel_agrees() -> bool:
    """Once per process: the compiled sums, norms, min and max of awkward rows (widths
    around every lane, step and level boundary, a 1e-30..1e30 range) equal torch's bit for
    bit, and their hashes torch's path's (``torch_row_hash``); if not (another torch build, another
    CPU), stats mode keeps torch's path."""
    from aligntools.tracker import compiled_row_stats

    g = torch.Generator().manual_seed(0xC0DE)
    for n, d in [(1, 1), (3, 5), (2, 63), (9, 64), (5, 65), (64, 255), (7, 1024 + 3), (3, 4096 * 4 + 17),
                 (2, 32767), (600, 37)]:
        x = torch.randn(n, d, generator=g) * torch.exp(torch.randn(n, d, generator=g) * 8)
        got, flags = compiled_row_stats.row_sums(x, keys(x.shape[1]))
        want = (x.amin(1).double(), x.amax(1).double(), *_sum_l2(x), torch_row_hash(x.view(torch.int32)))
        if flags or not all(torch.equal(a.view(torch.int8), b.view(torch.int8)) for a, b in zip(got, want)):
            warnings.warn("stats: the compiled row kernel does not reproduce torch's sums on this build; "
                          "using torch's path (same values, slower)", stacklevel=2)
            return False
    return True


def _masked_stats(flt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The slow path for rows holding NaN/inf: summaries over the finite entries, as
    (mn, mx, mean, l2, [N, 3] amax / n_nan / n_inf)."""
    wide = flt.double()
    nan, inf = torch.isnan(wide), torch.isinf(wide)
    finite = ~(nan | inf)
    cnt = finite.sum(1)
    zeroed = torch.where(finite, wide, 0.0)
    none = cnt == 0
    mn = torch.where(none, torch.nan, torch.where(finite, wide, torch.inf).amin(1))
    mx = torch.where(none, torch.nan, torch.where(finite, wide, -torch.inf).amax(1))
    l2 = torch.where(none, torch.nan, torch.linalg.vector_norm(zeroed, dim=1))
    amax = torch.maximum(mx.abs(), mn.abs())  # here, on [N]: NaN rows keep the payload they always had
    masked = torch.stack([amax, nan.sum(1).double(), inf.sum(1).double()], dim=1)
    return mn, mx, zeroed.sum(1) / cnt, l2, masked
