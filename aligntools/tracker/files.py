"""The finished capture files: netCDF (``*.nc``) and zarr (``*.zarr``), written in one go.

Why written only at the end: neither HDF5 nor a growing zarr store survives a ``kill -9``
mid-write (HDF5 leaves a "bad object header"; zarr arrays of different lengths). Streaming goes
to the journal (``aligntools.tracker.journal``); these writers run when every row is known, so
each variable is created at its final size, with chunks sized to the data (a 4-token capture
is kilobytes, not 8 MiB per variable), into a temporary sibling that ``publish`` renames over
the target. An interrupted write leaves the target as it was.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aligntools.sites import TOKEN_COORDS
from aligntools.tracker.store import (REQUIRED_ATTRS, TOKEN, CaptureWriteError, Store, VarSpec, is_coord,
                                      plain_attrs)

_CHUNK_BYTES = 8 << 20  # zarr chunks hold at most about 8 MiB of one variable
# netCDF files up to this size are built in memory and written with plain Python I/O: libhdf5
# segfaults (at the latest when its objects are freed) after a failed write such as ENOSPC.
IN_MEMORY_NC_BYTES = 512 << 20
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_zarr_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "zarr.json").exists() or (p / ".zgroup").exists())


def check_target(p: Path) -> None:
    """Refuse to replace anything that is not a capture this project wrote: a directory that is
    not a zarr store, a file that is not HDF5 (netCDF4), and an HDF5 file or zarr store that
    lacks the capture attrs (``REQUIRED_ATTRS``, what ``Capture.load`` requires) or cannot be
    read (someone's weights, data set, a corrupt file). Never delete what the project did not
    write. Only the root attrs' names are read, never the data, so the check stays a few
    milliseconds at every ``out=`` capture."""
    if p.is_dir():
        if not is_zarr_dir(p):
            raise CaptureWriteError(f"{p} is an existing directory that is not a zarr capture; refusing to "
                                    f"overwrite it. Give a file path (cap.nc) or a new or existing *.zarr capture path")
        _require_capture_marks(p, "zarr store that is not a zarr capture", _zarr_attr_names)
    elif p.is_file():
        with open(p, "rb") as fh:
            if fh.read(8) != HDF5_MAGIC:
                raise CaptureWriteError(f"{p} is an existing file that is not a netCDF capture; refusing to "
                                        f"overwrite it. Give a new path or remove the file yourself")
        _require_capture_marks(p, "HDF5 file that is not a netCDF capture", _hdf5_attr_names)
    elif p.exists():
        raise CaptureWriteError(f"{p} exists and is neither a file nor a directory; refusing to replace it. "
                                f"Give a new path")


def _require_capture_marks(p: Path, kind: str, attr_names: Callable[[Path], set[str]]) -> None:
    """Raise unless ``p``'s root attrs hold every ``REQUIRED_ATTRS`` name; an unreadable ``p``
    is refused too (it may be someone's file that this reader does not understand)."""
    fix = "Choose another path, or delete it yourself if it is not needed"
    try:
        names = attr_names(p)
    except Exception as e:  # noqa: BLE001 - any failure to read means: not provably ours
        raise CaptureWriteError(f"{p} is an existing {kind}: it cannot be read ({type(e).__name__}: {e}); "
                                f"refusing to overwrite it. {fix}") from e
    missing = [m for m in REQUIRED_ATTRS if m not in names]
    if missing:
        raise CaptureWriteError(f"{p} is an existing {kind}: its attrs lack {missing}, which every capture "
                                f"has; refusing to overwrite it. {fix}")


def _hdf5_attr_names(p: Path) -> set[str]:
    """Root attr names of an HDF5 (netCDF4) file; no dataset is read."""
    import h5py

    with h5py.File(p, "r") as f:
        return set(f.attrs.keys())


def _zarr_attr_names(p: Path) -> set[str]:
    """Root group attr names of a zarr store (v2 or v3); no array is read."""
    import zarr

    return set(zarr.open_group(str(p), mode="r").attrs.keys())


def chunk_rows(spec: VarSpec, trailing: tuple[int, ...], n_rows: int) -> int:
    """Rows per zarr chunk: about 8 MiB of the variable, never more rows than it has."""
    row_bytes = int(np.prod(trailing, dtype=np.int64)) * spec.dtype.itemsize
    return int(max(1, min(n_rows, 1 << 16, _CHUNK_BYTES // max(row_bytes, 1))))


def publish(path: Path, write: Callable[[Path, str], None], n_bytes: int) -> None:
    """Run ``write(tmp, fmt)`` on a temporary sibling of ``path``, then rename it into place.

    ``fmt`` is ``"zarr"`` for ``*.zarr`` paths and existing zarr stores, else ``"nc"``. A disk
    without room for ``n_bytes`` (the data's size) is refused before anything is written. On
    any error the temporary is removed and ``path`` is untouched; OSErrors (a full disk:
    ENOSPC) become a ``CaptureWriteError`` naming the path.
    """
    check_target(path)
    fmt = "zarr" if path.suffix == ".zarr" or is_zarr_dir(path) else "nc"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)
        free = shutil.disk_usage(path.parent).free
        if free < n_bytes + (1 << 20):
            raise OSError(errno.ENOSPC, f"No space left on device: needs about {n_bytes / 2**20:.1f} MiB, "
                                        f"{free / 2**20:.1f} MiB free")
        write(tmp, fmt)
        if path.is_dir():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            _remove(old)
        else:
            os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        if isinstance(e, CaptureWriteError):
            raise
        raise CaptureWriteError(e.errno or errno.EIO, f"cannot write capture {path}: {e.strerror or e}") from e
    except BaseException:
        _remove(tmp)
        raise


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


def file_writer(path: Path, fmt: str, attrs: dict, n_rows: int, n_bytes: int) -> "ZarrWriter | NetCDFWriter":
    """A writer for a capture of exactly ``n_rows`` token rows (same interface as ``Store``)."""
    if fmt == "zarr":
        return ZarrWriter(path, attrs, n_rows)
    return NetCDFWriter(path, attrs, n_rows, in_memory=n_bytes <= IN_MEMORY_NC_BYTES)


class ZarrWriter:
    """zarr v3 group; arrays created at their final size (unwritten chunks read as the fill)."""

    def __init__(self, path: Path, attrs: dict, n_rows: int) -> None:
        import zarr

        self._group = zarr.open_group(str(path), mode="w", zarr_format=3)
        self._group.attrs.update(plain_attrs(attrs))
        self._total, self._n = n_rows, 0

    def append(self, specs: dict[str, VarSpec], block: dict[str, np.ndarray], n_rows: int) -> None:
        for name, arr in block.items():
            if name not in self._group:
                spec, trailing = specs[name], arr.shape[1:]
                self._group.create_array(
                    name, shape=(self._total, *trailing), chunks=(chunk_rows(spec, trailing, self._total), *trailing),
                    dtype=spec.dtype, fill_value=spec.fill, dimension_names=list(spec.dims),
                    attributes=_var_attrs(name, spec), compressors=None)
            self._group[name][self._n:self._n + n_rows] = arr
        self._n += n_rows

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        self._group[name].oindex[rows] = values

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        arr = self._group.create_array(name, shape=values.shape, dtype=str if values.dtype.kind == "U"
                                       else values.dtype, dimension_names=list(spec.dims),
                                       attributes=plain_attrs(spec.attrs))
        arr[:] = values

    def close(self, attrs: dict) -> None:
        self._group.attrs.update(plain_attrs(attrs))

    def abort(self) -> None:
        """Nothing to release: every zarr write is a finished file."""


class NetCDFWriter:
    """netCDF4 (HDF5) through h5netcdf; contiguous variables of the final size, so the file
    is as large as the data."""

    def __init__(self, path: Path, attrs: dict, n_rows: int, in_memory: bool) -> None:
        try:
            import h5netcdf
        except ImportError as e:
            raise CaptureWriteError(
                f"cannot write netCDF capture {path}: {e}. Install h5py, or save to a '.zarr' path") from e
        self.path = path
        self._buffer = io.BytesIO() if in_memory else None
        self._file = h5netcdf.File(self._buffer if in_memory else str(path), "w")
        self._file.dimensions[TOKEN] = n_rows
        self._file.attrs.update(plain_attrs(attrs))
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
                var = f.create_variable(name, spec.dims, dtype=spec.dtype, fillvalue=spec.fill)
                var.attrs.update(_var_attrs(name, spec))
            f.variables[name][self._n:self._n + n_rows] = arr
        self._n += n_rows

    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        var = self._file.variables[name]
        for r, v in zip(rows.tolist(), values):
            var[r] = v

    def set_static(self, name: str, spec: VarSpec, values: np.ndarray) -> None:
        self._ensure_dims(spec.dims, values.shape)
        import h5py

        is_text = values.dtype.kind == "U"
        var = self._file.create_variable(name, spec.dims, dtype=h5py.string_dtype() if is_text else values.dtype)
        var[:] = values.astype(object) if is_text else values

    def close(self, attrs: dict) -> None:
        self._file.attrs.update(plain_attrs(attrs))
        self._file.close()
        if self._buffer is not None:
            with open(self.path, "wb") as fh:
                fh.write(self._buffer.getbuffer())

    def abort(self) -> None:
        """Release the HDF5 handle after a failed write (its file is about to be removed)."""
        try:
            self._file.close()
        except Exception:  # noqa: BLE001 - the write already failed; that error is the one to report
            pass


def write_capture(path: Path, fmt: str, attrs: dict, n_rows: int, n_bytes: int,
                  fill: Callable[[Store], None]) -> None:
    """Create the file, let ``fill(writer)`` add the variables, write the final ``attrs``."""
    writer = file_writer(path, fmt, attrs, n_rows, n_bytes)
    try:
        fill(writer)
        writer.close(attrs)
    except BaseException:
        writer.abort()
        raise


def _var_attrs(name: str, spec: VarSpec) -> dict:
    """Variable attrs on disk; row variables name the token coords so readers attach them."""
    attrs = plain_attrs(spec.attrs)
    attrs.pop("coordinates", None)
    if not is_coord(name):
        attrs["coordinates"] = " ".join(TOKEN_COORDS)
    return attrs
