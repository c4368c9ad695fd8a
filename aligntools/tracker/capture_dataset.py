"""``Capture``: one engine run's activations under the site vocabulary, as an xarray.Dataset.

Why xarray: a capture must be readable without the model (notebooks, CI, another machine),
carry its provenance (engine, dtype, knobs, versions, model hash) next to the numbers, and
line up with a capture of another engine by site name and token coords. The layout is the
binding contract of docs/architecture.md ("Capture"); this class only wraps it.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from aligntools.tracker.files import publish, write_capture
from aligntools.tracker.journal import is_journal, load_journal, partial_path, read_index
from aligntools.tracker.store import EMITTED, REQUIRED_ATTRS, TOKEN, VarSpec, plain_attrs
from aligntools.tracker.provenance import library_versions
from aligntools.sites import TOKEN_COORDS, sort_sites

class CaptureFileError(ValueError):
    """A capture file that cannot be read as a capture: names the file and the problem."""


class Capture:
    """A finished (or partial) capture. ``dataset`` is the xarray.Dataset of the contract."""

    def __init__(self, dataset: xr.Dataset) -> None:
        self.dataset = dataset

    @property
    def sites(self) -> list[str]:
        """Captured site names in execution order."""
        return sort_sites([str(v) for v in self.dataset.data_vars])

    @property
    def mode(self) -> str:
        return str(self.dataset.attrs["mode"])

    @property
    def engine(self) -> str:
        return str(self.dataset.attrs["engine"])

    @property
    def complete(self) -> bool:
        """False for a capture cut short (exception, budget error, crash while writing)."""
        return bool(int(self.dataset.attrs["complete"]))

    @property
    def knobs(self) -> dict:
        return json.loads(self.dataset.attrs["knobs"])

    @property
    def unquantized(self) -> dict[str, str]:
        """Weights the engine's quantization format could not hold (name -> why), kept in full
        precision; empty for an engine that quantizes nothing or everything it was asked to."""
        return json.loads(self.dataset.attrs.get("unquantized", "{}"))

    @property
    def versions(self) -> dict:
        return json.loads(self.dataset.attrs["versions"])

    def __getitem__(self, site: str) -> xr.DataArray:
        if site not in self.dataset.data_vars:
            raise KeyError(f"site {site!r} not in this capture; captured sites: {', '.join(self.sites)}")
        return self.dataset[site]

    def __contains__(self, site: str) -> bool:
        return site in self.dataset.data_vars

    def __repr__(self) -> str:
        n = self.dataset.sizes.get(TOKEN, 0)
        state = "complete" if self.complete else "PARTIAL"
        return (f"<Capture engine={self.engine} mode={self.mode} dtype={self.dataset.attrs['dtype']} "
                f"{len(self.sites)} sites x {n} tokens, {state}>")

    def save(self, path: str | os.PathLike) -> Path:
        """Write to netCDF (``*.nc``, needs h5py) or zarr (``*.zarr``); returns the path.

        Written to a temporary sibling and renamed into place, so an interrupted save leaves
        ``path`` as it was. Attrs are stored as plain Python values, so a capture loaded
        from either format saves to the other.
        """
        ds = self.dataset.load()  # a lazily loaded capture may be saved over its own file
        specs = {str(n): VarSpec(tuple(map(str, v.dims)), v.dtype, dict(v.attrs)) for n, v in ds.variables.items()}
        rows = {str(n): np.asarray(v.values) for n, v in ds.variables.items() if v.dims[:1] == (TOKEN,)}
        n_rows = int(ds.sizes.get(TOKEN, 0))

        def fill(writer) -> None:
            for name, v in ds.variables.items():
                if v.dims[:1] != (TOKEN,):
                    writer.set_static(str(name), specs[str(name)], np.asarray(v.values))
            writer.append(specs, rows, n_rows)

        attrs = plain_attrs(ds.attrs)
        publish(Path(path), lambda tmp, fmt: write_capture(tmp, fmt, attrs, n_rows, ds.nbytes, fill), ds.nbytes)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, lazy: bool = False) -> "Capture":
        """Read a capture file written by ``save`` or by a streaming Tracker.

        ``lazy=True`` leaves the values on disk until used (large captures). A partial file
        loads with a warning and ``complete == False``. Library versions that differ from
        the reader's are noted in ``dataset.attrs["version_mismatch"]`` (JSON). Anything
        that is not a readable capture raises ``CaptureFileError`` naming the file.
        """
        p = Path(path)
        source = _source(p)
        try:
            if is_journal(source):
                ds = load_journal(source)
            elif source.is_dir():
                ds = xr.open_zarr(str(source), consolidated=False)
            else:
                # No mask decoding: it would turn int sites (topk_ids, coords) into float.
                ds = xr.open_dataset(str(source), engine="h5netcdf", mask_and_scale=False)
                for var in ds.variables.values():
                    var.attrs.pop("_FillValue", None)
            if not lazy:
                ds = ds.load()
        except Exception as e:  # noqa: BLE001 - every backend failure becomes one clear error
            hint = " (netCDF reading needs h5py)" if isinstance(e, ImportError) else ""
            raise CaptureFileError(f"cannot read capture {source}: {type(e).__name__}: {e}{hint}") from e
        ds = ds.set_coords([v for v in ds.data_vars if str(v).startswith(EMITTED)])
        ds.attrs = plain_attrs(ds.attrs)
        for var in ds.variables.values():
            var.attrs = plain_attrs(var.attrs)
        _validate(ds, p)
        if "stat" in ds.coords:
            ds = ds.assign_coords(stat=np.array([str(x) for x in ds["stat"].values]))
        mismatch = _version_mismatch(json.loads(ds.attrs["versions"]))
        if mismatch:
            ds.attrs["version_mismatch"] = json.dumps(mismatch)
        cap = cls(ds)
        if not cap.complete:
            where = f" (rows read from its journal {source})" if source != p else ""
            warnings.warn(f"capture {p} is partial (complete=0): the run stopped before it finished{where}",
                          stacklevel=2)
        return cap


def _source(p: Path) -> Path:
    """What to read for ``p``: the file itself, or the journal of a run that never finished
    (``kill -9``, exception, budget): see ``aligntools.tracker.journal``."""
    journal = partial_path(p)
    if p.exists():
        if is_journal(journal) and not _journal_complete(journal):
            warnings.warn(f"{journal} holds a newer, unfinished capture of {p}; reading {p}. "
                          f"Capture.load({str(journal)!r}) reads the unfinished one", stacklevel=3)
        return p
    if is_journal(journal):
        return journal
    raise FileNotFoundError(f"capture file {p} does not exist")


def _journal_complete(journal: Path) -> bool:
    try:
        return bool(int(read_index(journal)["attrs"].get("complete", 0)))
    except (OSError, ValueError, KeyError):
        return False


def _validate(ds: xr.Dataset, path: Path) -> None:
    missing = [a for a in REQUIRED_ATTRS if a not in ds.attrs]
    if missing:
        raise CaptureFileError(f"{path} is not a capture file: dataset attrs {missing} are missing")
    if ds.data_vars and TOKEN in ds.dims:
        absent = [c for c in TOKEN_COORDS if c not in ds.coords]
        if absent:
            raise CaptureFileError(f"{path} is not a capture file: token coords {absent} are missing")
    for key in ("knobs", "versions"):
        try:
            json.loads(ds.attrs[key])
        except (TypeError, json.JSONDecodeError) as e:
            raise CaptureFileError(f"{path}: attr {key!r} is not valid JSON ({e})") from e
    for key, allowed, meaning in (("complete", (0, 1, "0", "1"), "0 or 1 (1 once the capture finished)"),
                                  ("mode", ("stats", "tensor"), "'stats' or 'tensor' (how it was captured)")):
        if ds.attrs[key] not in allowed:
            raise CaptureFileError(f"cannot read capture {path}: attr {key!r} is {ds.attrs[key]!r}; it must be "
                                   f"{meaning}")


def _version_mismatch(written: dict) -> dict[str, list]:
    now = library_versions()
    return {lib: [ver, now[lib]] for lib, ver in written.items() if lib in now and now[lib] != ver}
