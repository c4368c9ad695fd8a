"""Where a capture's rows go while it is being recorded: memory, or a crash-safe journal on disk.

Why one append-only interface: the Tracker flushes blocks of finished token rows as it goes,
so a long capture streams to disk instead of growing in memory. On disk the rows go to a
journal (``aligntools.tracker.journal.open_store``) that survives ``kill -9`` at any moment, and the
``.nc`` / ``.zarr`` file the user asked for (``aligntools.tracker.files``) is written from it
and renamed into place only when the run finished. Every variable is ``(token, ...)`` except
``stat`` (the stats-mode coordinate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import xarray as xr

from aligntools.sites import TOKEN_COORDS, sort_sites

TOKEN = "token"
# Dataset attrs every capture carries, partial ones included (the Tracker writes them when it
# opens its store): ``Capture.load`` requires them, and ``out=`` / ``Capture.save`` replace
# only a target that has them (``files.check_target``)
REQUIRED_ATTRS = ("engine", "mode", "dtype", "knobs", "versions", "model_hash", "complete")
EMITTED = "emitted."  # prefix of the per-site int8 row masks: 1 where the engine emitted the row


class CaptureWriteError(OSError):
    """A capture file cannot be created or written (names the path and the reason)."""


@dataclass(frozen=True)
class VarSpec:
    """Layout of one variable: dims (``token`` first for row variables), numpy dtype,
    fill for rows a site did not emit (NaN, or -1 for integers) and variable attrs."""

    dims: tuple[str, ...]
    dtype: np.dtype
    attrs: dict = field(default_factory=dict)

    @property
    def fill(self) -> float | int:
        return np.nan if np.issubdtype(self.dtype, np.floating) else -1


class Store(Protocol):
    def append(self, specs: dict[str, VarSpec], block: dict[str, np.ndarray], n_rows: int) -> None:
        """Add ``n_rows`` token rows; variables absent from ``block`` read as their fill."""

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Overwrite already-appended rows of one variable (late-resolved values)."""

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        """Write a variable without a token dim (the ``stat`` coordinate)."""

    def close(self, attrs: dict) -> None:
        """Write the final dataset attrs (incl. ``complete``) and release the file."""


def is_coord(name: str) -> bool:
    """Token coords and emitted masks are coordinates, not sites."""
    return name in TOKEN_COORDS or name.startswith(EMITTED)


class MemoryStore:
    """Rows kept as numpy blocks; ``dataset()`` concatenates them once at the end, the
    sites in execution order."""

    def __init__(self, attrs: dict) -> None:
        self.attrs = dict(attrs)
        self._n = 0
        self._specs: dict[str, VarSpec] = {}
        self._blocks: dict[str, list[np.ndarray]] = {}
        self._static: dict[str, tuple[VarSpec, np.ndarray]] = {}
        self._patches: list[tuple[str, np.ndarray, np.ndarray]] = []

    def append(self, specs: dict[str, VarSpec], block: dict[str, np.ndarray], n_rows: int) -> None:
        for name, arr in block.items():
            if name not in self._blocks:
                self._specs[name] = specs[name]
                self._blocks[name] = [_filled(specs[name], self._n, arr.shape[1:])] if self._n else []
        for name, parts in self._blocks.items():
            arr = block.get(name)
            if arr is None:
                ref = parts[0] if parts else None
                arr = _filled(self._specs[name], n_rows, ref.shape[1:] if ref is not None else ())
            parts.append(arr)
        self._n += n_rows

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        self._patches.append((name, rows, values))

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        self._static[name] = (spec, values)

    def close(self, attrs: dict) -> None:
        self.attrs.update(attrs)

    def dataset(self) -> xr.Dataset:
        data = {}
        for name, parts in self._blocks.items():
            arr = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else \
                np.empty((0,), self._specs[name].dtype)
            data[name] = arr
        for name, rows, values in self._patches:
            data[name][rows] = values
        coords = {n: _variable(self._specs[n], data.pop(n)) for n in list(data) if is_coord(n)}
        for name, (spec, values) in self._static.items():
            coords[name] = _variable(spec, values)
        variables = {n: _variable(self._specs[n], data[n]) for n in sort_sites(list(data))}
        return assemble(variables, coords, self.attrs)


def assemble(data_vars: dict[str, xr.Variable], coords: dict[str, xr.Variable], attrs: dict) -> xr.Dataset:
    """``xr.Dataset(data_vars, coords=coords, attrs=attrs)``, the same dataset (tested), built
    without the public constructor's merge.

    Why: the merge aligns and shallow-copies every variable, ~20 us each, about 1 ms for a
    capture of 41 sites: the largest fixed cost of a capture on a small model. The store's
    variables need none of it (one ``token`` dim of one length; no index but the ``stat``
    coordinate's, which the constructor still builds from the coords that are their own dim).
    """
    indexed = {n: v for n, v in coords.items() if v.dims == (n,)}
    frame = xr.Dataset(coords=indexed) if indexed else None  # [stat]: its index (~80 us even when empty)
    variables = {**data_vars, **coords, **(frame.variables if frame is not None else {})}
    return xr.Dataset._construct_direct(variables, set(coords), dims=None, attrs=dict(attrs),
                                        indexes=dict(frame.xindexes) if frame is not None else {})


def _variable(spec: VarSpec, values: np.ndarray) -> xr.Variable:
    """A store array as an xarray Variable, taken as it is (already the stored dtype)."""
    return xr.Variable(spec.dims, values, spec.attrs, fastpath=True)


def _filled(spec: VarSpec, n: int, trailing: tuple[int, ...]) -> np.ndarray:
    return np.full((n, *trailing), spec.fill, dtype=spec.dtype)


def plain_attrs(attrs: dict) -> dict:
    """Attrs as plain Python scalars that both netCDF and zarr (JSON) store: numpy scalars
    (netCDF gives ``complete`` back as ``numpy.int64``) become Python ones, bools ints,
    dicts/lists JSON strings, bytes text; ``None`` values are left out."""
    out = {}
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            value = value.item() if value.size == 1 else value.tolist()
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (dict, list, tuple)):
            value = json.dumps(value, default=str)
        if value is not None:
            out[str(key)] = value
    return out
