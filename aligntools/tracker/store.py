"""Where a capture's rows go while it is being recorded: memory, a zarr store or netCDF.

Why one append-only interface for all three: the Tracker flushes blocks of finished token
rows as it goes, so a long capture streams to disk instead of growing in memory, and a crash
leaves a file that holds every flushed row with ``complete=0`` (the attr flips to 1 only in
``close(complete=True)``). ``Capture.save`` uses the same writers, so there is one file
layout. Every variable is ``(token, ...)`` except ``stat`` (the stats-mode coordinate).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import xarray as xr

TOKEN = "token"
TOKEN_COORDS = ("token_id", "position", "request", "step")
_CHUNK_BYTES = 8 << 20  # rows per on-disk chunk: about 8 MiB of one variable


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


def open_store(path: str | os.PathLike | None, attrs: dict) -> Store:
    """A store for ``path``: ``None`` keeps rows in memory, ``*.zarr`` (or an existing zarr
    capture directory) writes zarr, anything else writes netCDF4 through h5netcdf.

    Any other existing directory is refused: opening it as zarr would wipe what is in it.
    """
    if path is None:
        return MemoryStore(attrs)
    p = Path(path)
    if p.is_dir() and not (p / "zarr.json").exists() and not (p / ".zgroup").exists():
        raise CaptureWriteError(f"{p} is an existing directory that is not a zarr capture; refusing to "
                                f"overwrite it. Give a file path (cap.nc) or a new or existing *.zarr capture path")
    if p.suffix == ".zarr" or p.is_dir():
        return ZarrStore(p, attrs)
    return NetCDFStore(p, attrs)


def chunk_rows(spec: VarSpec, trailing: tuple[int, ...]) -> int:
    row_bytes = int(np.prod(trailing, dtype=np.int64)) * spec.dtype.itemsize
    return int(max(1, min(1 << 16, _CHUNK_BYTES // max(row_bytes, 1))))


class MemoryStore:
    """Rows kept as numpy blocks; ``dataset()`` concatenates them once at the end."""

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
        coords = {n: xr.Variable(self._specs[n].dims, data.pop(n), self._specs[n].attrs)
                  for n in TOKEN_COORDS if n in data}
        for name, (spec, values) in self._static.items():
            coords[name] = xr.Variable(spec.dims, values, spec.attrs)
        variables = {n: xr.Variable(self._specs[n].dims, a, self._specs[n].attrs) for n, a in data.items()}
        return xr.Dataset(variables, coords=coords, attrs=self.attrs)


class ZarrStore:
    """zarr v3 group written array by array; readable by ``xarray.open_zarr`` at any time."""

    def __init__(self, path: Path, attrs: dict) -> None:
        import zarr

        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._group = zarr.open_group(str(path), mode="w", zarr_format=3)
            self._group.attrs.update(_plain(attrs))
        except OSError as e:
            raise CaptureWriteError(f"cannot write capture to {path}: {e.strerror or e}") from e
        self._n = 0

    def append(self, specs: dict[str, VarSpec], block: dict[str, np.ndarray], n_rows: int) -> None:
        for name, arr in block.items():
            if name not in self._group:
                spec = specs[name]
                trailing = arr.shape[1:]
                self._group.create_array(
                    name, shape=(self._n, *trailing), chunks=(chunk_rows(spec, trailing), *trailing),
                    dtype=spec.dtype, fill_value=spec.fill, dimension_names=list(spec.dims),
                    attributes=_var_attrs(name, spec), compressors=None)
        end = self._n + n_rows
        for name, arr in self._group.arrays():
            if arr.metadata.dimension_names and arr.metadata.dimension_names[0] == TOKEN:
                arr.resize((end, *arr.shape[1:]))
                if name in block:
                    arr[self._n:end] = block[name]
        self._n = end

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        self._group[name].oindex[rows] = values

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        arr = self._group.create_array(name, shape=values.shape, dtype=str if values.dtype.kind == "U"
                                       else values.dtype, dimension_names=list(spec.dims),
                                       attributes=dict(spec.attrs))
        arr[:] = values

    def close(self, attrs: dict) -> None:
        self._group.attrs.update(_plain(attrs))


class NetCDFStore:
    """netCDF4 (HDF5) through h5netcdf with an unlimited ``token`` dim; flushed per append."""

    def __init__(self, path: Path, attrs: dict) -> None:
        try:
            import h5netcdf

            self._file = h5netcdf.File(str(path), "w")
        except ImportError as e:
            raise CaptureWriteError(
                f"cannot write netCDF capture {path}: {e}. Install h5py, or save to a '.zarr' path") from e
        except OSError as e:
            raise CaptureWriteError(f"cannot write capture to {path}: {e.strerror or e}") from e
        self.path = path
        self._file.dimensions[TOKEN] = None
        self._file.attrs.update(_plain(attrs))
        self._n = 0

    def _ensure_dims(self, dims: tuple[str, ...], shape: tuple[int, ...]) -> None:
        for dim, size in zip(dims, shape):
            if dim not in self._file.dimensions:
                self._file.dimensions[dim] = size

    def append(self, specs: dict[str, VarSpec], block: dict[str, np.ndarray], n_rows: int) -> None:
        f = self._file
        for name, arr in block.items():
            if name not in f.variables:
                spec = specs[name]
                self._ensure_dims(spec.dims[1:], arr.shape[1:])
                var = f.create_variable(name, spec.dims, dtype=spec.dtype, fillvalue=spec.fill,
                                        chunks=(chunk_rows(spec, arr.shape[1:]), *arr.shape[1:]))
                var.attrs.update(_var_attrs(name, spec))
        end = self._n + n_rows
        f.resize_dimension(TOKEN, end)
        for name, arr in block.items():
            f.variables[name][self._n:end] = arr
        self._n = end
        f.flush()

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        var = self._file.variables[name]
        for r, v in zip(rows.tolist(), values):
            var[r] = v
        self._file.flush()

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        self._ensure_dims(spec.dims, values.shape)
        import h5py

        is_text = values.dtype.kind == "U"
        var = self._file.create_variable(name, spec.dims, dtype=h5py.string_dtype() if is_text else values.dtype)
        var[:] = values.astype(object) if is_text else values
        self._file.flush()

    def close(self, attrs: dict) -> None:
        self._file.attrs.update(_plain(attrs))
        self._file.close()


def _filled(spec: VarSpec, n: int, trailing: tuple[int, ...]) -> np.ndarray:
    return np.full((n, *trailing), spec.fill, dtype=spec.dtype)


def _var_attrs(name: str, spec: VarSpec) -> dict:
    """Variable attrs on disk; row variables name the token coords so readers attach them."""
    attrs = _plain(spec.attrs)
    if name not in TOKEN_COORDS:
        attrs["coordinates"] = " ".join(TOKEN_COORDS)
    return attrs


def _plain(attrs: dict) -> dict:
    """Attrs as netCDF/zarr-storable scalars (dicts and lists become JSON strings)."""
    return {k: json.dumps(v) if isinstance(v, (dict, list, tuple)) else v for k, v in attrs.items()}
