"""``run_log.netcdf_bytes``: the run log's file, written ~4x faster than xarray writes it, is the same file
to xarray (values, NaN, coordinates, events, monitor readings) and a netCDF-4 file to h5py's reading of
its dimension scales, for the row counts a run has (none yet, one, many with gaps)."""

from __future__ import annotations

import io
import json
import math

import h5py
import numpy as np
import pytest
import xarray as xr

from minirl.training import run_log
from minirl.training.run_log import RunLog, monitor_dataset, netcdf_bytes, to_dataset

READINGS = [{"step": 0, "rel_l2": {"embed": 0.0, "L0.q": 1e-6}, "first_divergence": "", "routing_flips": {"0": 0.1},
             "seconds": 0.2},
            {"step": 2, "rel_l2": {"L0.q": 2e-6}, "first_divergence": "L0.q", "routing_flips": {"0": 0.25}}]


def _log(rows: list[dict], readings: list[dict]) -> xr.Dataset:
    ds = to_dataset(rows)
    if readings:
        ds = ds.merge(monitor_dataset(readings))
    ds.attrs["events"] = json.dumps([{"step": 1, "event": "lr changed on resume at step 1: 0.01 -> 0.05"}])
    return ds


@pytest.mark.parametrize("rows", [[], [{"step": 0, "reward": 0.5}],
                                  [{"step": i, **{f"m{j}": i + j / 7 for j in range(60) if (i + j) % 5}}
                                   for i in range(6)]])
@pytest.mark.parametrize("readings", [[], READINGS])
def test_xarray_reads_the_same_log_it_writes_itself(rows, readings):
    ds = _log(rows, readings)
    ours = xr.load_dataset(io.BytesIO(netcdf_bytes(ds)), engine="h5netcdf")
    theirs = xr.load_dataset(io.BytesIO(ds.to_netcdf(engine="h5netcdf")), engine="h5netcdf")
    xr.testing.assert_identical(ours[sorted(ours.data_vars)], theirs[sorted(theirs.data_vars)])
    if len(rows) > 1:  # a metric missing from a row is NaN, as to_dataset made it
        assert math.isnan(float(ours["m0"][0])) and float(ours["m1"][0]) == pytest.approx(1 / 7)


def test_each_metric_is_a_netcdf_variable_over_the_row_dimension():
    """What a netCDF-4 reader (netCDF-C, ncdump) needs of a variable: its dimension scale and ids."""
    ds = _log([{"step": s, "reward": s / 2, "loss": 1.0} for s in range(3)], READINGS)
    with h5py.File(io.BytesIO(netcdf_bytes(ds)), "r") as f:
        assert f["row"].attrs["CLASS"] == b"DIMENSION_SCALE"
        for name in ("reward", "loss"):
            var = f[name]
            assert var.dims[0][0] == f["row"] and var.attrs["coordinates"] == "step"
            assert var.attrs["_Netcdf4Dimid"] == f["row"].attrs["_Netcdf4Dimid"]
            np.testing.assert_array_equal(var[()], ds[name].values)


def test_a_run_log_round_trips_through_its_file(tmp_path):
    log = RunLog(tmp_path / "metrics.nc")
    log.note(1, "checkpoint recovered")
    log.read(READINGS[0])
    for step in range(3):
        log.append(step, {"reward": step / 4, "loss": 2.0 - step})
    back = run_log.load(tmp_path / "metrics.nc")
    assert back["step"].values.tolist() == [0, 1, 2] and back["reward"].values.tolist() == [0.0, 0.25, 0.5]
    assert run_log.events(back) == [{"step": 1, "event": "checkpoint recovered"}]
    assert back["monitor_rel_l2"].sel(site="L0.q").values.tolist() == [1e-6]
