"""The engine-neutral core of the Tracker: turns ``emit(site, value, meta)`` into capture rows.

Adapters (hf, minirl, vllm, ...) only translate their engine into ``emit`` calls with the
architecture doc's token layout ([N, ...] flat over tokens + per-token meta). Everything else is
here, once: the token row table (one row per (request, position, step)), the token filter,
tensor vs stats storage, the byte budget, the derived ``logprobs``/``entropy`` sites, and
streaming finished rows to a store so a long capture does not have to fit in memory.

Why values are buffered the way they are: ``emit`` runs inside the engine's forward, so it
does only what needs the live tensor. Tensor mode keeps the engine's tensor by reference
where that is checked to be safe (``borrowed.Borrowed``: an in-place write after the hook is
an error at flush, never a wrong value), else copies it in the engine's dtype (a bf16 copy
is half a float32 one), and widens to float32 / int64 when rows are written; stats mode
runs ``reduce_rows`` and finishes the stats rows of every site in one batch at flush time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Literal

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

from aligntools.tracker import pending
from aligntools.tracker.borrowed import Borrowed, can_borrow
from aligntools.tracker.store import EMITTED, TOKEN, MemoryStore, Store, VarSpec
from aligntools.tracker.derived import DeviceLogits, NextTokenLogprobs
from aligntools.sites import TOKEN_COORDS, trailing_dims
from aligntools.tracker.stats import STAT_NAMES, RowReduction, device_row_stats, finish_rows, reduce_rows, row_stats
from aligntools.tracker.token_meta import TokenMetaLike

DERIVED = ("logprobs", "entropy")
# Sites an engine emits for some rows only (generate: logits at each request's last token).
# Their ``emitted.<site>`` int8 mask (1 = emitted) lets compare tell a row the engine never
# computed (NaN fill) from a NaN blow-up. logprobs is left out: its NaN rows are tokens whose
# successor was never seen, which the mask of logits already accounts for.
MASKED = ("logits", "entropy")
TokenFilter = Callable[[TokenMetaLike], torch.Tensor]  # -> BoolTensor [N]: which rows to keep
_TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                np.dtype(np.int64): torch.int64}  # stored numpy dtype -> the torch dtype to widen to


class CaptureBudgetExceeded(RuntimeError):
    """Tensor capture would exceed ``budget_bytes``; what was captured before is kept."""


@dataclass(frozen=True)
class CaptureRows:
    """The capture rows of one engine call's tokens, shared by every site emitted for them.

    Why not the bare index tensor: the flush asks each site's chunk which step it belongs to
    (``first``) and whether it can be stored as it is (``span``); answered once per forward
    here, not once per site (a tensor read or compare costs microseconds, times ~40 sites).
    """

    ids: torch.Tensor  # [n] int64
    first: int  # ids[0] (a chunk's rows all belong to one step)
    span: bool  # ids == first + arange(n): rows stored in order, no scatter

    @classmethod
    def of(cls, ids: list[int]) -> "CaptureRows":
        span = ids == list(range(ids[0], ids[0] + len(ids))) if ids else False
        return cls(torch.tensor(ids, dtype=torch.long), ids[0] if ids else 0, span)

    def __len__(self) -> int:
        return self.ids.shape[0]


Chunk = tuple[CaptureRows, torch.Tensor | Borrowed | RowReduction]  # (capture rows, their values or reduction)


class Recorder:
    """Accumulates emitted site values into token rows and flushes them to a store.

    ``sites``: the selected site names (derived ones included). ``flush_bytes``: buffered
    bytes of finished rows that trigger a write to the store (None: only at ``finish``).
    ``copy``: tensor mode copies every value in the hook, never keeping a reference.
    """

    def __init__(self, sites: list[str], mode: Literal["tensor", "stats"], store: Store, *,
                 budget_bytes: int | None = None, on_budget: Literal["error", "stats"] = "error",
                 token_filter: TokenFilter | None = None, flush_bytes: float | None = 64 << 20,
                 progress: bool | None = None, copy: bool = False) -> None:
        if mode not in ("tensor", "stats"):
            raise ValueError(f"mode must be 'tensor' or 'stats', got {mode!r}")
        if on_budget not in ("error", "stats"):
            raise ValueError(f"on_budget must be 'error' or 'stats', got {on_budget!r}")
        self.mode = mode
        self.copy = copy
        self.sites = set(sites)
        self.store = store
        self.budget_bytes, self.on_budget = budget_bytes, on_budget
        self.token_filter = token_filter
        self.flush_bytes = math.inf if flush_bytes is None else flush_bytes
        self.notes: list[str] = []
        wanted = [d in self.sites for d in DERIVED]  # logprobs, entropy
        self._derive = NextTokenLogprobs(*wanted) if any(wanted) else None
        # what an adapter must emit: the selected sites, plus ``logits`` for derived ones
        self.needed = frozenset((self.sites - set(DERIVED)) | ({"logits"} if self._derive else set()))
        self._specs: dict[str, VarSpec] = {
            c: VarSpec((TOKEN,), np.dtype(np.int64)) for c in TOKEN_COORDS}
        self._specs.update({EMITTED + s: VarSpec((TOKEN,), np.dtype(np.int8)) for s in self.sites & set(MASKED)})
        self._dim_sizes: dict[str, int] = {}
        self._keys: dict[tuple[int, int, int], int] = {}
        self._token_of: dict[tuple[int, int], int] = {}
        self._coords: dict[str, list[int]] = {c: [] for c in TOKEN_COORDS}
        self._buffer: dict[str, list[Chunk]] = {}
        self._late: dict[str, list[tuple[int, float]]] = {}
        self._buffered_bytes = 0
        self._stored_bytes = 0
        self._flushed = 0  # rows [0, _flushed) are in the store
        self._done = 0  # rows [0, _done) belong to finished steps
        self._step_flush = True  # False once an engine marks forwards (steps may interleave)
        self._step_key: tuple[int, int] | None = None
        self._call = -1
        self._req_offset = 0
        self._n_requests = 0
        self._meta_cache: tuple[TokenMetaLike, torch.Tensor | None, torch.Tensor, list] | None = None
        # progress=None: tqdm shows the bar only on a terminal
        self._bar = tqdm(desc="capture", unit="tok", disable=None if progress is None else not progress,
                         leave=False)
        self._stat_written = False
        self._forward: PendingForward | None = None  # a device forward not yet read (``pending``)

    @property
    def n_tokens(self) -> int:
        """Token rows captured so far."""
        return len(self._coords["step"])

    @property
    def saw_forward(self) -> bool:
        """Whether an engine call reached the recorder (its first emit or ``begin_call``)."""
        return self._call >= 0

    # ---- what adapters call -------------------------------------------------------------

    def begin_call(self) -> None:
        """A new engine call: its request indices start after every earlier call's."""
        self.end_forward()
        self._req_offset = self._n_requests
        self._call += 1
        self._meta_cache = None
        if self._derive:  # earlier calls' last rows never get a next token
            self._derive = NextTokenLogprobs(self._derive.logprobs, self._derive.entropy)

    def forward_boundary(self) -> None:
        """A new forward starts: every row seen so far is complete and may be flushed.

        For engines that mix requests at different decode steps inside one forward (vLLM/SGLang
        continuous batching), where a change of step does not mean the previous step is done.
        """
        self.end_forward()
        self._step_flush = False
        self._done = len(self._coords["step"])
        self._maybe_flush()

    def emit(self, site: str, value: torch.Tensor, meta: TokenMetaLike, *, owned: bool = False,
             borrow: bool = False) -> None:
        """Record ``value`` [N, ...] (the engine's dtype, N = len(meta.request)). ``owned``: the
        adapter made ``value`` for this call and the engine holds no reference to it, so tensor
        mode keeps it as it is instead of copying it. ``borrow``: the engine writes ``value``
        only through torch ops (which bump its version counter), so tensor mode may keep it by
        reference, checked when it is read (``borrowed.Borrowed``)."""
        if self._call < 0:
            self.begin_call()
        if pending.on_device(value):
            self._defer(site, value.detach(), meta, owned=owned, borrow=borrow)
            return
        keep, rows, keys = self._rows(meta)
        if len(rows) == 0:
            return
        v = value.detach()
        if keep is not None:
            v = v[keep.to(v.device)]
        if site in self.sites:
            self._store(site, rows, v, copy=keep is None and not owned, borrow=borrow and not self.copy)
        if site == "logits" and self._derive is not None:
            for name, val in zip(DERIVED, self._derive.on_logits(rows.ids, keys, v, self._token_of)):
                if val is not None:
                    self._store(name, rows, val, copy=False, dtype_attr="float32")

    def end_forward(self) -> None:
        """The device forward being held has ended: bring its values over (one copy, one
        sync) and record them. Adapters call it from the root module's forward hook; an
        engine that marks no forward end gets it at its next step, call or ``finish``."""
        fwd, self._forward = self._forward, None
        if fwd is None:
            return
        host = fwd.to_host()
        for entry in host.entries:
            meta, valid_rows = host.metas[id(entry.meta)]
            keep, rows, keys = self._rows(meta)
            if len(rows) == 0:
                continue
            kept = valid_rows if keep is None else (keep if valid_rows is None else valid_rows[keep])
            if entry.derived is not None:
                self._record_derived(entry.derived, host.numbers, kept, rows, keys)
            else:
                data = host.numbers[id(entry.data)] if entry.stats else entry.data
                self._buffer_rows(entry.site, rows, _take_rows(data, kept), entry.dtype)

    def _defer(self, site: str, v: torch.Tensor, meta: TokenMetaLike, *, owned: bool, borrow: bool) -> None:
        """Hold ``v`` [N, ...] of a device forward (all of its rows, padding included: which
        rows are kept is a host question, answered at ``end_forward``); nothing is read here."""
        fwd = self._forward
        if fwd is not None and fwd.step != meta.step:
            self.end_forward()  # an engine without forward hooks: a new step starts a new forward
            fwd = None
        if fwd is None:
            fwd = self._forward = pending.PendingForward(meta.step, v.device)
        dtype = str(v.dtype).removeprefix("torch.")
        if site in self.sites:
            if self.mode == "stats":
                stats = device_row_stats(v)  # [N, 8] float64, on the device
                fwd.add(pending.Entry(site, meta, stats, dtype, stats=True), stats)
            else:
                fwd.add(pending.Entry(site, meta, self._hold(site, v, copy=not owned, borrow=borrow and not self.copy),
                                      dtype))
        if site == "logits" and self._derive is not None:
            held = self._derive.on_device_logits(v, fwd.targets(meta))
            fwd.add(pending.Entry(site, meta, None, "float32", derived=held), *held.numbers())

    def _record_derived(self, held: DeviceLogits, numbers: dict[int, torch.Tensor], kept: torch.Tensor | None,
                        rows: CaptureRows, keys: list) -> None:
        """The derived sites of a device forward's logits, from their host copies."""
        for name, val in zip(DERIVED, self._derive.resolve_device(held, numbers, kept, rows.ids, keys,
                                                                   self._token_of)):
            if val is not None:
                self._buffer_rows(name, rows, val if self.mode == "tensor" else row_stats(val), "float32")

    def finish(self, attrs: dict, complete: bool) -> None:
        """Flush every row, write ``attrs`` with ``complete`` and close the store."""
        if complete:
            self.end_forward()
        self._forward = None
        self._flush(len(self._coords["step"]))
        self._bar.close()
        final = {**attrs, "mode": self.mode, "complete": int(complete)}
        if self.notes:
            final["notes"] = "; ".join(self.notes)
        self.store.close(final)

    # ---- rows ---------------------------------------------------------------------------

    def _rows(self, meta: TokenMetaLike) -> tuple[torch.Tensor | None, CaptureRows, list]:
        """(kept local indices or None for all, capture rows, (request, position) keys)."""
        cache = self._meta_cache
        if cache is not None and cache[0] is meta:
            return cache[1:]
        request = (meta.request.cpu() + self._req_offset).tolist()
        position = meta.position.cpu().tolist()
        token = meta.token_id.cpu().tolist()
        step = int(meta.step)
        self._n_requests = max(self._n_requests, max(request, default=-1) + 1)
        keep = None
        if self.token_filter is not None:
            keep = torch.nonzero(_filter_mask(self.token_filter(meta), len(request)))[:, 0]
        self._learn_tokens(list(zip(request, position)), token)
        if self._step_flush and (self._call, step) != self._step_key:
            self._step_key = (self._call, step)
            self._done = len(self._coords["step"])
            self._maybe_flush()
        idx = range(len(request)) if keep is None else keep.tolist()
        keys = [(request[i], position[i]) for i in idx]
        rows = self._row_ids(keys, [token[i] for i in idx], step)
        out = (keep, CaptureRows.of(rows), keys)
        self._meta_cache = (meta, *out)
        return out

    def _learn_tokens(self, keys: list[tuple[int, int]], tokens: list[int]) -> None:
        """Remember the first token seen at each (request, position); a new one may resolve
        the pending logprob of the row before it."""
        resolve = self._derive is not None and self._derive.logprobs
        for key, token in zip(keys, tokens):
            if key not in self._token_of:
                self._token_of[key] = token
                if resolve:
                    self._resolve_late(key, token)

    def _row_ids(self, keys: list[tuple[int, int]], tokens: list[int], step: int) -> list[int]:
        """The capture row of each (request, position) at ``step``; unseen ones get new rows
        (one row per (request, position, step), so ``len(self._keys)`` is the row count)."""
        rows, fresh = [], []
        first_new = len(self._keys)
        for (request, position), token in zip(keys, tokens):
            row = self._keys.setdefault((request, position, step), len(self._keys))
            if row == first_new + len(fresh):  # just added
                fresh.append((token, position, request, step))
            rows.append(row)
        for name, values in zip(TOKEN_COORDS, zip(*fresh)):
            self._coords[name].extend(values)
        self._bar.update(len(fresh))
        return rows

    def _resolve_late(self, key: tuple[int, int], token: int) -> None:
        hit = self._derive.on_token(key, token)
        if hit is not None:
            self._late.setdefault("logprobs", []).append(hit)

    # ---- values -------------------------------------------------------------------------

    def _store(self, site: str, rows: CaptureRows, v: torch.Tensor, *, copy: bool, borrow: bool = False,
               dtype_attr: str | None = None) -> None:
        if self.budget_bytes is not None and self._stored_bytes + self._nbytes(v) > self.budget_bytes:
            self._over_budget(site, v)
        if self.mode == "stats":
            data = reduce_rows(v)  # finished into [n, 8] float64 rows at flush
        else:  # the engine's dtype on the CPU; widened when written
            data = self._hold(site, v, copy=copy, borrow=borrow)
        self._buffer_data(site, rows, data, v, dtype_attr)

    def _hold(self, site: str, v: torch.Tensor, *, copy: bool, borrow: bool) -> torch.Tensor | Borrowed:
        """Tensor mode's rows of ``v`` [n, ...] on the host: kept by checked reference, copied, or
        (from a device) copied asynchronously into pinned memory (``pending.host_copy``)."""
        rows_v = v.reshape(v.shape[0], *_trailing(site, v.shape[1:]))  # [n, *trailing]
        if copy and borrow and can_borrow(rows_v):
            return Borrowed.of(site, rows_v)
        if rows_v.is_cpu:
            return rows_v.clone() if copy else rows_v
        return pending.host_copy(rows_v)

    def _buffer_rows(self, site: str, rows: CaptureRows, data: torch.Tensor | Borrowed, dtype_attr: str) -> None:
        """Buffer host ``data`` (stats rows or tensor rows) that a device forward left, checking
        the budget as ``_store`` does."""
        value = data.value if isinstance(data, Borrowed) else data
        if self.budget_bytes is not None and self._stored_bytes + self._nbytes(value) > self.budget_bytes:
            self._over_budget(site, value)
            if self.mode == "stats" and value.shape[1:] != (len(STAT_NAMES),):  # downgraded just now
                data = value = row_stats(data.take() if isinstance(data, Borrowed) else data)
        self._buffer_data(site, rows, data, value, dtype_attr)

    def _buffer_data(self, site: str, rows: CaptureRows, data: torch.Tensor | Borrowed | RowReduction,
                     v: torch.Tensor, dtype_attr: str | None) -> None:
        if site not in self._specs:
            self._specs[site] = self._spec(site, v, dtype_attr or str(v.dtype).removeprefix("torch."))
        nbytes = self._nbytes(data)
        self._stored_bytes += nbytes
        self._buffered_bytes += nbytes
        self._buffer.setdefault(site, []).append((rows, data))

    def _nbytes(self, v: torch.Tensor | RowReduction) -> int:
        """Bytes ``v`` [n, ...] takes once stored (float32 / int64 values, or float64 stats
        rows), whatever it takes while buffered; checked before anything is allocated."""
        if self.mode == "stats":
            return len(v) * len(STAT_NAMES) * 8
        if isinstance(v, Borrowed):
            v = v.value
        return v.numel() * (4 if v.is_floating_point() else 8)

    def _spec(self, site: str, v: torch.Tensor, dtype_attr: str) -> VarSpec:
        spec = _var_spec(site, dtype_attr, v.is_floating_point(), self.mode == "stats")
        if self.mode == "stats":
            return spec
        dims = tuple(self._dim_name(dim, size, site) for dim, size in zip(spec.dims[1:], _trailing(site, v.shape[1:])))
        return spec if dims == spec.dims[1:] else VarSpec((TOKEN, *dims), spec.dtype, spec.attrs)

    def _dim_name(self, dim: str, size: int, site: str) -> str:
        """``dim``, or ``dim.<site>`` where this capture already has ``dim`` at another size
        (raw module paths all name their dim "feature")."""
        if self._dim_sizes.setdefault(dim, size) == size:
            return dim
        renamed = f"{dim}.{site}"
        self._dim_sizes[renamed] = size
        return renamed

    def _over_budget(self, site: str, v: torch.Tensor) -> None:
        msg = (f"capturing {site!r} would bring the capture to {self._stored_bytes + self._nbytes(v)} bytes, "
               f"over budget_bytes={self.budget_bytes}")
        if self.mode == "stats" or self.on_budget == "error":
            raise CaptureBudgetExceeded(msg + "; the rows captured so far are kept (capture marked partial)")
        self._downgrade()
        self.notes.append(f"downgraded to stats mode at token row {len(self._coords['step'])}: {msg}")
        if self._stored_bytes + self._nbytes(v) > self.budget_bytes:
            raise CaptureBudgetExceeded(msg + " even in stats mode")

    def _downgrade(self) -> None:
        """Switch to stats mode, reducing everything captured so far (all still buffered)."""
        if self._flushed:
            raise CaptureBudgetExceeded("cannot downgrade to stats: rows were already written to the store")
        self.mode = "stats"
        self._stored_bytes = self._buffered_bytes = 0
        for site, chunks in self._buffer.items():
            reduced = [(rows, row_stats(data.take() if isinstance(data, Borrowed) else data)) for rows, data in chunks]
            self._buffer[site] = reduced
            nbytes = sum(d.nbytes for _, d in reduced)
            self._stored_bytes += nbytes
            self._buffered_bytes += nbytes
            self._specs[site] = VarSpec((TOKEN, "stat"), np.dtype(np.float64), self._specs[site].attrs)

    # ---- flushing -----------------------------------------------------------------------

    def _maybe_flush(self) -> None:
        if self._buffered_bytes >= self.flush_bytes:
            self._flush(self._done)

    def _flush(self, hi: int) -> None:
        lo = self._flushed
        if self.mode == "stats" and not self._stat_written:
            self.store.set_static("stat", VarSpec(("stat",), np.dtype("<U5")), np.array(STAT_NAMES))
            self._stat_written = True
        if hi <= lo:
            return
        if self.mode == "stats":
            self._finish_stats()
        block = {c: np.asarray(vals[lo:hi], dtype=np.int64) for c, vals in self._coords.items()}
        for site in self.sites & set(MASKED):
            block[EMITTED + site] = np.zeros(hi - lo, dtype=np.int8)
        for site, chunks in self._buffer.items():
            now = [(r, d) for r, d in chunks if r.first < hi]
            if not now:
                continue
            self._buffer[site] = [(r, d) for r, d in chunks if r.first >= hi]
            self._buffered_bytes -= sum(self._nbytes(d) for _, d in now)
            block[site] = self._block(self._specs[site], now, lo, hi)
            if site in MASKED:
                for rows, _ in now:
                    block[EMITTED + site][rows.ids.numpy() - lo] = 1
        late = self._patch_late(block, lo, hi)
        self.store.append(self._specs, block, hi - lo)
        self._flushed = hi
        for site, hits in late.items():
            self.store.write_rows(site, np.array([r for r, _ in hits]),
                                  np.stack([self._late_value(v) for _, v in hits]))

    def _finish_stats(self) -> None:
        """Every buffered ``RowReduction`` becomes its stats rows, all sites in one batch."""
        pending = [(chunks, i) for chunks in self._buffer.values() for i, (_, data) in enumerate(chunks)
                   if isinstance(data, RowReduction)]
        done = finish_rows([chunks[i][1] for chunks, i in pending]) if pending else []
        for (chunks, i), stats in zip(pending, done):
            chunks[i] = (chunks[i][0], stats)

    @staticmethod
    def _block(spec: VarSpec, chunks: list[Chunk], lo: int, hi: int) -> np.ndarray:
        """Rows lo..hi of one variable from its chunks, in the stored dtype; no further copy
        when one chunk covers them in order (the usual case: a site emitted once per step for
        all of its rows) and already has that dtype."""
        target = _TORCH_DTYPE[spec.dtype]
        if len(chunks) == 1:
            rows, data = chunks[0]
            if rows.span and rows.first == lo and len(rows) == hi - lo:
                if isinstance(data, Borrowed):  # becomes the capture's array where already float32
                    data = data.take(exclusive=data.value.dtype == target)
                return data.to(target).numpy()
        values = [(rows, data.take() if isinstance(data, Borrowed) else data) for rows, data in chunks]
        arr = np.full((hi - lo, *values[0][1].shape[1:]), spec.fill, dtype=spec.dtype)
        for rows, data in values:
            arr[rows.ids.numpy() - lo] = data.to(target).numpy()
        return arr

    def _patch_late(self, block: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, list]:
        """Late-resolved logprobs of rows < hi: patched into ``block`` where they fall in it;
        returns the rest (rows already in the store, rewritten after the append)."""
        rest: dict[str, list] = {}
        for site, hits in self._late.items():
            self._late[site] = [(r, v) for r, v in hits if r >= hi]
            for row, val in hits:
                if row >= hi:
                    continue
                if site in block and row >= lo:
                    block[site][row - lo] = self._late_value(val)
                else:
                    rest.setdefault(site, []).append((row, val))
        return rest

    def _late_value(self, value: float) -> np.ndarray:
        if self.mode == "stats":
            return row_stats(torch.tensor([[value]], dtype=torch.float32))[0].numpy()
        return np.float32(value)

    def dataset(self) -> xr.Dataset:
        """The in-memory dataset, variables in execution order (MemoryStore, after ``finish``)."""
        if not isinstance(self.store, MemoryStore):
            raise TypeError("dataset() is for in-memory captures; load the file the store wrote")
        return self.store.dataset()


@lru_cache(maxsize=1 << 12)
def _var_spec(site: str, dtype_attr: str, floating: bool, stats: bool) -> VarSpec:
    """The stored layout of a site (cached: every capture asks for each of its sites; the
    specs are never modified)."""
    attrs = {"dtype": dtype_attr, **({"derived_from": "logits"} if site in DERIVED else {})}
    if stats:
        return VarSpec((TOKEN, "stat"), np.dtype(np.float64), attrs)
    return VarSpec((TOKEN, *trailing_dims(site)), np.dtype(np.float32 if floating else np.int64), attrs)


@lru_cache(maxsize=1 << 12)
def _trailing(site: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape after the token dim, ``shape`` (a value's ``shape[1:]``), under the site's
    dims: extra dims are flattened into the last one (cached: asked for every site of every
    forward)."""
    n_dims = len(trailing_dims(site))
    if n_dims == 0:
        return ()
    return (*shape[:n_dims - 1], math.prod(shape[n_dims - 1:]))


def _filter_mask(mask: object, n: int) -> torch.Tensor:
    """``token_filter``'s answer as a bool [n] CPU tensor, or a ValueError: an index tensor,
    a float mask or a wrong length would otherwise keep the wrong rows without a word."""
    got = mask if isinstance(mask, torch.Tensor) else _as_tensor(mask)
    if got is None or got.dtype != torch.bool or tuple(got.shape) != (n,):
        what = f"{type(mask).__name__} {mask!r:.60}" if got is None else f"{got.dtype} of shape {tuple(got.shape)}"
        raise ValueError(f"token_filter must return a bool tensor of shape [{n}] (one entry per token of the "
                         f"call, True = keep), got {what}; e.g. lambda meta: meta.position >= 3")
    return got.cpu()


def _as_tensor(value: object) -> torch.Tensor | None:
    """``value`` as a tensor, or None where it is none (a str, None, an object): the caller
    names what it got instead of torch's "new(): invalid data type 'str'"."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _take_rows(data: torch.Tensor | Borrowed, kept: torch.Tensor | None) -> torch.Tensor | Borrowed:
    """Host ``data`` [N, ...] of a device forward reduced to its ``kept`` rows (None: all)."""
    if kept is None:
        return data
    return (data.take() if isinstance(data, Borrowed) else data)[kept]
