"""Per-step metrics of a run, written to netCDF as they are produced, and their plots.

Crash safety: after every step the whole log is written to a temporary file and renamed over
the previous one (``os.replace`` is atomic), so a run killed at any point leaves the last
complete log readable. Logs are small (one row of floats per step), so rewriting is cheap: ~80 ms with 60
metrics (``netcdf_bytes``; docs/measurements/2026-12-07-run-log-flush.md).

Besides the rows, a log keeps *events*: what happened to the run itself at a step (a value
changed on resume, a checkpoint recovered), in the dataset attribute ``events`` (JSON list of
``{"step": N, "event": text}``), so a curve's kink can be traced to its cause.

With the mismatch monitor on (``monitor_every``, ``minirl.training.monitor``), a log also keeps its
*readings*, one per monitor step, as arrays over the dims ``monitor_step`` x ``site`` (relative
error) and ``monitor_step`` x ``layer`` (routing flips): docs/runs.md lists the variables.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # xarray loads on first use: `import minirl` stays light
    import xarray as xr

class RunLog:
    """Rows of ``{metric: float}`` keyed by step, mirrored to ``path`` after each ``append``."""

    def __init__(self, path: str | os.PathLike, rows: list[dict] | None = None,
                 events: list[dict] | None = None, readings: list[dict] | None = None) -> None:
        self.path = Path(path)
        self.rows: list[dict] = [dict(r) for r in rows or []]
        self.events: list[dict] = [dict(e) for e in events or []]
        self.readings: list[dict] = [dict(r) for r in readings or []]  # ``Reading.to_dict()``s, by step
        self.unwritten = False  # a note or reading kept since the last flush

    def note(self, step: int, event: str) -> None:
        """Record ``event`` (one line of text) at ``step``; written with the next ``flush``."""
        self.events.append({"step": int(step), "event": event})
        self.unwritten = True

    def append(self, step: int, metrics: dict[str, float]) -> None:
        bad = [k for k in metrics if "/" in k]
        if bad:  # checked before the row is kept: the log on disk stays as it was
            raise ValueError(f"metric names {bad} contain '/', which netCDF reserves for groups; use '_' instead")
        self.rows.append({"step": int(step), **{k: float(v) for k, v in metrics.items()}})
        self.flush()

    def read(self, reading: dict) -> None:
        """Keep one monitor reading (``minirl.training.monitor.Reading.to_dict()``); written with the
        next ``flush`` (the step's row, ``Lifecycle.record``): a flush rewrites the whole file (~80 ms
        with 60 metrics), which a tiny model's reading should not cost twice."""
        self.readings.append(dict(reading))
        self.unwritten = True

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        ds = to_dataset(self.rows)
        if self.readings:
            ds = ds.merge(monitor_dataset(self.readings))
        ds.attrs["events"] = json.dumps(self.events)
        data = netcdf_bytes(ds)  # built in memory: a full disk is then an OSError of ours, not
        try:  # an HDF5 error whose half-written file crashes the interpreter at exit (exit 139, not 2)
            tmp.write_bytes(data)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno != errno.ENOSPC:
                raise
            raise OSError(errno.ENOSPC, f"no space left on the device of {self.path.parent} while writing the run "
                                        f"log {self.path} (as {tmp.name}); the log as of the previous step is intact: "
                                        f"free space there, then continue with --resume") from None
        os.replace(tmp, self.path)
        self.unwritten = False


def netcdf_bytes(ds: xr.Dataset) -> bytes:
    """``ds.to_netcdf(engine="h5netcdf")``, the same file, ~5x faster: xarray and h5netcdf spend ~7 ms of
    dimension bookkeeping per variable (0.4 s per flush with 60 metrics, paid after every step), so the
    per-step metrics, float64 over ``row``, are added with h5py and attached to the ``row`` dimension
    scale with the attributes h5netcdf gives them; the rest (``step``, the monitor's readings) is
    written by xarray. xarray reads it back identical, netCDF-C reads it as netCDF-4 (tests)."""
    import h5py

    metrics = [n for n, v in ds.data_vars.items() if v.dims == ("row",) and v.dtype == np.float64]
    buf = io.BytesIO(ds.drop_vars(metrics).to_netcdf(engine="h5netcdf"))
    with h5py.File(buf, "r+") as f:
        row = f["row"]
        dimid = np.int32(row.attrs["_Netcdf4Dimid"])  # the id h5netcdf gave ``row`` among the file's dimensions
        for name in metrics:
            var = f.create_dataset(name, data=ds[name].values, fillvalue=np.nan)
            var.dims[0].attach_scale(row)
            var.attrs.update({"_Netcdf4Coordinates": np.array([dimid], dtype=np.int32), "_Netcdf4Dimid": dimid,
                              "_FillValue": np.array([np.nan]), "coordinates": "step"})
    return buf.getvalue()


def to_dataset(rows: list[dict]) -> xr.Dataset:
    """Rows -> Dataset with dim ``row`` (coordinate ``step``); missing values are NaN."""
    import xarray as xr

    names = sorted({k for r in rows for k in r} - {"step"})
    data = {n: ("row", np.array([r.get(n, math.nan) for r in rows], dtype=np.float64)) for n in names}
    return xr.Dataset(data, coords={"step": ("row", np.array([r["step"] for r in rows], dtype=np.int64))})


def monitor_dataset(readings: list[dict]) -> xr.Dataset:
    """Monitor readings -> ``monitor_rel_l2 [monitor_step, site]``, ``monitor_first_divergence
    [monitor_step]`` (site name, '' for none), ``monitor_seconds [monitor_step]`` (the reading's
    wall time) and ``monitor_routing_flips [monitor_step, layer]`` (absent for a dense model); a
    value a reading lacks is NaN."""
    import xarray as xr

    sites = list(dict.fromkeys(s for r in readings for s in r["rel_l2"]))
    layers = sorted({int(k) for r in readings for k in r["routing_flips"]})
    rel = np.array([[r["rel_l2"].get(s, math.nan) for s in sites] for r in readings], dtype=np.float64)
    data = {"monitor_rel_l2": (("monitor_step", "site"), rel.reshape(len(readings), len(sites))),
            "monitor_first_divergence": ("monitor_step", np.array([r["first_divergence"] for r in readings],
                                                                  dtype=object)),
            "monitor_seconds": ("monitor_step", np.array([r.get("seconds", math.nan) for r in readings],
                                                         dtype=np.float64))}
    coords = {"monitor_step": np.array([r["step"] for r in readings], dtype=np.int64),
              "site": np.array(sites, dtype=object)}
    if layers:
        flips = [[r["routing_flips"].get(str(i), math.nan) for i in layers] for r in readings]
        data["monitor_routing_flips"] = (("monitor_step", "layer"), np.array(flips, dtype=np.float64))
        coords["layer"] = np.array(layers, dtype=np.int64)
    return xr.Dataset(data, coords=coords)


def load(path: str | os.PathLike) -> xr.Dataset:
    """Read a run log (loaded into memory, the file is closed); ``events(ds)`` lists its events."""
    import xarray as xr

    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def events(log: xr.Dataset) -> list[dict]:
    """The events of a loaded log (``RunLog.note``), oldest first; [] for a log without any."""
    return json.loads(log.attrs.get("events", "[]"))
