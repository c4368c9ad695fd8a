"""One pass over the aligned rows of many sites: tiles on threads, chunks in cache, disk in budget.

Why this shape: comparing two captures is a streaming reduction (every element is read once,
a few dozen numbers per token come out), so its speed is set by how often each element is
touched and where it sits when it is.

- A *chunk* (about ``chunk_elems`` elements of one site, whole rows) is what a kernel works
  on: its float64 scratch stays in the core's cache, so the kernel's many numpy passes run
  from cache and each captured element comes from memory once.
- A *tile* (many chunks) is what a thread takes from the shared queue. numpy and BLAS release
  the GIL, so tiles of different sites, or of one big site, run on every core; the biggest
  sites go first so the last tiles are small and the threads finish together.
- Rows still on disk (a capture loaded lazily: a path given to ``compare``) are read one tile
  at a time, sized so that the tiles in flight fit half of ``max_memory``: a capture larger
  than memory is compared without ever being loaded whole.

Chunks start at multiples of ``chunk_rows`` whatever the tiling (tiles are whole chunks), so
every row is reduced in the same call shape whatever ``workers`` or ``max_memory`` are: the
numbers do not depend on them. (They would on the chunk size for the rare rows whose dot
product falls back to ``np.einsum``, which rounds a row alone in its call differently from a
row in a batch.)
"""

from __future__ import annotations

import math
import numbers
import os
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from aligntools.tracker.capture_dataset import CaptureFileError

DEFAULT_MAX_MEMORY = 1 << 30
"""Bytes of capture data in flight when rows are read from disk and ``max_memory`` is not given."""

TILE_CHUNKS = 32
"""Chunks per tile of in-memory rows: ~1M elements, enough work to hide the queue and the
Python around it, small enough that two threads get many tiles of one big site."""

Kernel = Callable[[np.ndarray, np.ndarray, Any, slice], None]
"""``kernel(xa, xb, workspace, rows)``: chunk rows [r, D] of both sides and the slice of the
site's aligned rows they are; writes that slice of the site's per-row outputs."""


@dataclass(frozen=True)
class Rows:
    """The aligned rows of one side of a site: row i is ``data[idx[i]]`` (``data[i]`` if idx
    is None). ``data``: a numpy array [N_side, D], or a DataArray whose values are still on
    disk (a lazily loaded capture), read tile by tile."""

    data: np.ndarray | xr.DataArray
    idx: np.ndarray | None = None

    @classmethod
    def of(cls, v: xr.DataArray | np.ndarray, idx: np.ndarray | None = None) -> Rows:
        """Rows of a site variable [N, ...]: in-memory values as a [N, D] view, a lazily
        loaded variable left on disk."""
        if isinstance(v, xr.DataArray) and not _in_memory(v):
            return cls(v, idx)
        x = np.asarray(v)
        return cls(x.reshape(len(x), -1), idx)

    def __len__(self) -> int:
        return len(self.data) if self.idx is None else len(self.idx)

    @property
    def on_disk(self) -> bool:
        return not isinstance(self.data, np.ndarray)

    @property
    def width(self) -> int:
        """Elements per row (D)."""
        return int(np.prod(self.data.shape[1:], dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        return self.width * self.data.dtype.itemsize

    def tile(self, start: int, stop: int) -> Rows:
        """Rows start:stop with their values in memory: a view (or index slice) of in-memory
        data, a read from disk otherwise."""
        if self.on_disk:
            return Rows(_read(self.data, slice(start, stop) if self.idx is None else self.idx[start:stop]))
        if self.idx is None:
            return Rows(self.data[start:stop])
        return Rows(self.data, self.idx[start:stop])

    def chunk(self, start: int, stop: int) -> np.ndarray:
        """Rows start:stop of an in-memory tile as [r, D] (a gather where rows are indexed)."""
        return self.data[start:stop] if self.idx is None else self.data[self.idx[start:stop]]

    def blocks(self, max_bytes: int) -> Iterable[np.ndarray]:
        """All rows in order as in-memory [r, D] blocks: one block when in memory, tiles of
        at most ``max_bytes`` (at least one row) when on disk."""
        step = max(1, max_bytes // max(self.row_bytes, 1) if self.on_disk else len(self))
        for start in range(0, len(self), step):
            t = self.tile(start, min(start + step, len(self)))
            yield t.chunk(0, len(t))


def _in_memory(v: xr.DataArray) -> bool:
    """Whether a variable's values are loaded (xarray's own test; lazily opened files are not)."""
    return bool(getattr(v.variable, "_in_memory", True))


def _read(v: xr.DataArray, rows: slice | np.ndarray) -> np.ndarray:
    """Rows of a lazily loaded variable as [n, D]; a damaged file is a ``CaptureFileError``
    naming it and the site (a truncated zarr chunk otherwise fails with numpy's "cannot
    reshape array of size 25 into shape (16, 64)", which names neither)."""
    try:
        return _read_rows(v, rows)
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        where = v.encoding.get("source", "the capture file")
        raise CaptureFileError(f"{where}: site {v.name} cannot be read ({type(e).__name__}: {e}); the file is "
                               f"damaged: capture or save it again") from e


def _read_rows(v: xr.DataArray, rows: slice | np.ndarray) -> np.ndarray:
    """``_read`` itself. Index arrays are read in increasing order (what HDF5 and zarr
    selections want; as one range read where they are a range) and put back in the asked
    order in memory; in a chunked store, one storage chunk at a time (``_gather_chunks``)."""
    dim = v.dims[0]
    if isinstance(rows, slice):
        x = v.isel({dim: rows}).values
    elif (per_chunk := _chunk_rows(v)) and len(rows):
        x = _gather_chunks(v, rows, per_chunk)
    else:
        uniq, inv = np.unique(rows, return_inverse=True)
        dense = len(uniq) and uniq[-1] - uniq[0] + 1 == len(uniq)
        x = v.isel({dim: slice(uniq[0], uniq[-1] + 1) if dense else uniq}).values
        if len(uniq) != len(rows) or np.any(uniq != rows):
            x = x[inv]
    return x.reshape(len(x), -1)


def _chunk_rows(v: xr.DataArray) -> int | None:
    """Rows per storage chunk of a variable in a chunked store (zarr, chunked HDF5), None
    for contiguous storage (netCDF as ``Capture.save`` writes it), whose rows are read exactly."""
    chunks = v.encoding.get("chunks") or v.encoding.get("chunksizes")
    return int(chunks[0]) if chunks else None


def _gather_chunks(v: xr.DataArray, rows: np.ndarray, per_chunk: int) -> np.ndarray:
    """Rows ``rows`` [n] (any order, repeats allowed) of a chunked variable: one range read
    where they are exactly a range, else one read per storage chunk they touch, in increasing
    order, each selecting only its rows, written straight to their place in the result.

    Why not one fancy-indexed read: zarr decodes every chunk a selection touches at once, so
    rows of another layout (b gathered in a's order: a decode capture, shuffled requests)
    scattered over N chunks held N decoded chunks per tile (measured 169 MiB under a 16 MiB
    ``max_memory``). Here one decoded chunk is in flight per thread, as for rows in order.
    The bytes are the same, so the numbers do not change. The reads are not fewer: each tile
    still decodes every chunk its rows touch (see docs/analyzer.md)."""
    order = np.argsort(rows, kind="stable")
    srt = rows[order]
    dim = v.dims[0]
    if srt[-1] - srt[0] + 1 == len(srt) and np.all(np.diff(srt) == 1):  # exactly a range: one read
        return v.isel({dim: slice(int(srt[0]), int(srt[-1]) + 1)}).values[rows - srt[0]]
    out = np.empty((len(rows), *v.shape[1:]), dtype=v.dtype)
    cuts = np.flatnonzero(np.diff(srt // per_chunk)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(srt)], strict=True):
        uniq, inv = np.unique(srt[lo:hi], return_inverse=True)  # sorted: repeats are neighbours
        out[order[lo:hi]] = v.isel({dim: uniq}).values[inv]
    return out


@dataclass(frozen=True)
class Job:
    """One site: both sides' aligned rows and the kernel that fills its per-row outputs."""

    a: Rows
    b: Rows
    kernel: Kernel
    chunk_elems: int | None = None
    """Elements per chunk of this job; None: the run's. (A compiled kernel keeps no float64
    copy of the chunk in cache, so it takes bigger chunks: fewer Python calls per byte.)"""

    @property
    def nbytes(self) -> int:
        return len(self.a) * (self.a.row_bytes + self.b.row_bytes)

    @property
    def on_disk(self) -> bool:
        return self.a.on_disk or self.b.on_disk

    def chunk_rows(self, chunk_elems: int) -> int:
        """Rows per chunk: ``self.chunk_elems`` (else the run's ``chunk_elems``) over the width."""
        return max(1, (self.chunk_elems or chunk_elems) // max(self.a.width, 1))

    def tile_rows(self, chunk_elems: int, budget: int) -> int:
        """Rows per tile, always whole chunks: ``TILE_CHUNKS`` of them in memory; from disk as
        many as fit ``budget`` with room for a reordering copy (at least one)."""
        step = self.chunk_rows(chunk_elems)
        if not self.on_disk:
            return step * TILE_CHUNKS
        fit = budget // max(2 * (self.a.row_bytes + self.b.row_bytes), 1)
        return max(step, fit // step * step)


def check_max_memory(max_memory: object) -> int | None:
    """``max_memory`` as whole bytes (None stays None: ``DEFAULT_MAX_MEMORY``), or a
    ``ValueError`` saying what it must be. Why checked: 0 or False used to fall back to the
    default silently, a negative or NaN budget to one-row tiles, inf to an error deep inside
    the sweep, and True to a 1-byte budget."""
    if max_memory is None:
        return None
    ok = isinstance(max_memory, numbers.Real) and not isinstance(max_memory, (bool, np.bool_))
    if not ok or not math.isfinite(max_memory) or max_memory < 1:
        raise ValueError(f"max_memory must be a positive number of bytes (e.g. 1 << 30 for 1 GiB), or None "
                         f"for the default {DEFAULT_MAX_MEMORY >> 20} MiB; got {max_memory!r}")
    return int(max_memory)


def check_workers(workers: object) -> int | None:
    """``workers`` as a whole number of threads (None stays None: every core), or a
    ``ValueError`` saying what it must be. Why checked: 0 fell back to every core, a negative
    count to one thread and 2.5 to two, silently, and "2" failed inside ``min``."""
    if workers is None:
        return None
    if isinstance(workers, (bool, np.bool_)) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise ValueError(f"workers must be a positive whole number of threads (e.g. 2), or None for every core "
                         f"this process may use; got {workers!r}")
    return int(workers)


def disk_budget(max_memory: int | None) -> int:
    """Bytes of rows read from disk that may be in memory at once: half of ``max_memory``
    (default ``DEFAULT_MAX_MEMORY``; checked by ``check_max_memory``); the other half is
    headroom for results and scratch."""
    return (check_max_memory(max_memory) or DEFAULT_MAX_MEMORY) // 2


def workers_available(workers: int | None) -> int:
    """``workers`` (default: every core this process may run on), at most that many."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(check_workers(workers) or cores, cores)


def run(jobs: list[Job], workspace: Callable[[], Any], chunk_elems: int, workers: int | None = None,
        max_memory: int | None = None, progress: bool | None = None) -> None:
    """Apply every job's kernel to all of its rows, chunk by chunk, tiles on ``workers`` threads.

    workspace: makes one thread's scratch (reused across its chunks). max_memory: bytes of
    capture data in flight; half of it goes to tiles read from disk, the rest is headroom
    for per-token results and scratch. progress: a tqdm bar over the bytes compared (None:
    shown when rows are read from disk and stderr is a terminal).
    """
    n = workers_available(workers)
    budget = disk_budget(max_memory) // n
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for job in sorted(jobs, key=lambda j: -j.nbytes):  # biggest first: threads finish together
        rows = job.tile_rows(chunk_elems, budget)
        for start in range(0, len(job.a), rows):
            todo.put((job, start, min(start + rows, len(job.a))))
    if todo.empty():
        return
    show = progress if progress is not None else (None if any(j.on_disk for j in jobs) else False)
    with tqdm(total=sum(j.nbytes for j in jobs), unit="B", unit_scale=True, desc="compare",
              disable=None if show is None else not show, leave=False) as bar:
        _drain(todo, workspace, chunk_elems, n, bar)


def _drain(todo: queue.SimpleQueue, workspace: Callable[[], Any], chunk_elems: int, workers: int,
           bar: tqdm) -> None:
    """Run queued tiles on ``workers`` threads (inline for one); the first error stops all."""
    failed = threading.Event()

    def worker() -> None:
        ws = workspace()
        with np.errstate(all="ignore"):  # inf - inf, log 0: located and handled by the kernels
            while not failed.is_set():
                try:
                    job, start, stop = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    _run_tile(job, start, stop, chunk_elems, ws)
                except BaseException:
                    failed.set()
                    raise
                bar.update((stop - start) * (job.a.row_bytes + job.b.row_bytes))

    if workers == 1 or todo.qsize() == 1:
        worker()
        return
    with ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(worker) for _ in range(workers)]:
            f.result()


def _run_tile(job: Job, start: int, stop: int, chunk_elems: int, ws: Any) -> None:
    a, b = job.a.tile(start, stop), job.b.tile(start, stop)
    step = job.chunk_rows(chunk_elems)
    for s in range(0, stop - start, step):
        e = min(s + step, stop - start)
        job.kernel(a.chunk(s, e), b.chunk(s, e), ws, slice(start + s, start + e))
