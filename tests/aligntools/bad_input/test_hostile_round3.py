"""Cases of the third hostile pass (issue 38), each named by its id: output paths that are no place
for a file, sites that could not be compared, an engine spec with empty items. Device nodes,
FIFOs and sockets are made in a temporary directory; no real device is ever touched."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
from pathlib import Path

import h5py
import numpy as np
import pytest

import aligntools
from aligntools import Capture
from aligntools.gates.accuracy import accuracy_gate
from aligntools.viz.report import write_atomic
from labs import zoo as zoo_lib
from minirl import EngineSpec, OutputPathError, check_output_file
from tests.aligntools.analyzer.analyzer_synth import make_capture


def _nodes(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Things no report may replace: path -> the kind the message names."""
    fifo, dev, sock, data = (tmp_path / n for n in ("fifo", "full", "sock", "precious_capture.nc"))
    os.mkfifo(fifo)
    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 7))  # a /dev/full of our own (CR07)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    (tmp_path / "link").symlink_to(dev)
    h5py.File(data, "w").close()  # HDF5, as every capture and run log (CR06)
    return {fifo: "a FIFO", dev: "a character device", sock: "a socket", tmp_path / "link": "a character device",
            tmp_path: "a directory", data: "an HDF5/netCDF file (a capture, a run log or a data set)"}


def test_cr05_cr06_cr07_a_report_replaces_only_a_regular_file(tmp_path):
    """Before: the device node was replaced by an HTML file, and a capture was overwritten."""
    for path, kind in _nodes(tmp_path).items():
        mode = os.lstat(path).st_mode
        with pytest.raises(OutputPathError, match=re.escape(f"cannot write report to {path}: it is {kind}")):
            write_atomic(path, "<html>")
        assert os.lstat(path).st_mode == mode  # the node is still what it was
    old = tmp_path / "old.html"
    old.write_text("an earlier report")
    assert write_atomic(old, "new").read_text() == "new"


def test_cr05_mlab_check_refuses_the_report_path_before_running_the_check(tmp_path, mlab):
    """The report path is refused first: the model path here does not even exist."""
    for path, kind in _nodes(tmp_path).items():
        code, _, err = mlab("check", "--model", tmp_path / "no-model", "--report", path)
        assert code == 2 and f"cannot write report to {path}: it is {kind}" in err, err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs procfs")
def test_cr02_a_directory_that_takes_no_files_is_named_with_the_real_reason():
    """Before: "No such file or directory" about /proc/version, which exists."""
    with pytest.raises(OutputPathError, match=r"cannot write report to /proc/version: cannot create a file in /proc "
                                              r"\(a report is written to a temporary file there, then renamed\): the "
                                              r"file system there takes no new files"):
        write_atomic("/proc/version", "x")


def test_pl07_a_path_under_a_file_says_not_a_directory(tmp_path):
    """Before: "[Errno 17] File exists: '/etc/passwd'"."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match=f"cannot write figure to .*: {tmp_path / 'file'} is not a directory"):
        write_atomic_as = check_output_file(tmp_path / "file" / "x.png", "figure")  # new path: accepted here
        from minirl import temp_sibling

        temp_sibling(write_atomic_as, "figure")


def test_mlab_capture_refuses_a_device_or_fifo_before_loading_the_model(llama, tmp_path, mlab):
    nodes = _nodes(tmp_path)
    for path in [p for p, kind in nodes.items() if kind in ("a FIFO", "a character device", "a socket")]:
        mode = os.lstat(path).st_mode
        code, _, err = mlab("capture", "--model", llama, "--text", "hi", "--out", path)
        assert code == 2 and str(path) in err and "refusing to replace it" in err, err
        assert os.lstat(path).st_mode == mode


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs procfs")
def test_z08_zoo_build_into_a_directory_that_takes_no_files_fails_at_once():
    """Before: filelock retried forever on a lock file it could never create."""
    signal.alarm(120)  # a regression hangs: fail instead
    try:
        with pytest.raises(OutputPathError, match="cannot write zoo model to /proc/zoo_x: cannot create a file in "
                                                  "/proc .*takes no new files"):
            zoo_lib.build("tiny-llama", out="/proc/zoo_x", progress=False)
    finally:
        signal.alarm(0)


@pytest.mark.parametrize("spec", ["minirl:,,", "minirl:typical,,tp=2", "minirl:typical,", "hf:float32,,"])
def test_e02_an_engine_spec_with_empty_items_is_refused(spec):
    """Before: ``minirl:,,`` ran the default knobs (while ``minirl:typical,=1`` was refused)."""
    with pytest.raises(ValueError, match=f"engine spec '{spec}' has an empty item between commas"):
        EngineSpec.parse(spec)
    assert EngineSpec.parse("minirl:") == EngineSpec.parse("minirl")  # nothing after the colon: the default


@pytest.fixture(scope="module")
def synth():
    return make_capture(n_layers=1)


def _with(ds, site, values, dims=None):
    return ds.drop_vars(site).assign({site: (dims or ("token", f"{site}_dim"), values)})


@pytest.mark.parametrize("case, make, note", [
    ("e02", lambda a: _with(a, "embed", a["embed"].values[:, :, None], ("token", "hidden", "extra")),
     "not comparable: float32(16,) vs float32(16, 1)"),
    ("e07", lambda a: a.assign(logits=(a["logits"] * 100).astype(np.int64)), "not comparable: float32(32,) vs int64(32,)"),
    ("e09", lambda a: _with(a, "embed", a["embed"].values[:, 0], ("token",)), "not comparable: float32(16,) vs float32()"),
    ("e15", lambda a: _with(a, "logits", a["logits"].values[:, :10], ("token", "vocab10")),
     "not comparable: float32(32,) vs float32(10,)"),
    ("e08", lambda a: a.assign(embed=a["embed"].astype(np.complex64)), "not comparable: b holds complex64 values"),
])
def test_a_site_that_cannot_be_compared_fails_and_says_why(synth, case, make, note):
    """Before: rc 0 PASS with the site "skipped"."""
    site = "logits" if case in ("e07", "e15") else "embed"
    cmp = aligntools.compare(synth, make(synth))
    assert not cmp.passes and cmp.failures == [site] and cmp.not_compared[site].startswith(note)
    text = cmp.summary()
    assert f"1 sites not compared (each fails" in text and f"  {site}: {note}" in text
    assert aligntools.compare(synth, make(synth), sites=[s for s in synth.data_vars if s != site]).passes  # left out


def test_allnan_both_a_site_non_finite_on_both_sides_fails(synth):
    """Before: e03 against itself passed with no metric computed."""
    nan = synth.copy(deep=True)
    nan["L0.q"].values[:] = np.nan
    cmp = aligntools.compare(nan, nan)
    assert cmp.failures == ["L0.q"]
    assert "L0.q: no token has a finite value on both sides (all NaN or Inf)" in cmp.summary()


def test_an_accuracy_gate_fails_a_site_it_could_not_compare(synth):
    cand = synth.assign(embed=synth["embed"].astype(np.complex64))
    report = accuracy_gate(cand, synth, synth)
    assert report.failures == ["embed"] and report.table.loc["embed", "note"].startswith("not compared:")


def _save(ds, path: Path) -> Path:
    return Capture(ds).save(path)


def test_e06_e14_mlab_diff_names_the_site_and_the_file(synth, tmp_path, mlab):
    """Before: numpy's "Cannot cast array data from dtype('<U1')", and "invalid literal for int()"."""
    a = _save(synth, tmp_path / "a.nc")
    strings = tmp_path / "e06.nc"
    synth.assign(logits=synth["logits"].astype("U1")).to_netcdf(strings, engine="h5netcdf")
    code, out, _ = mlab("diff", a, strings)
    assert code == 1 and f"logits: not comparable: {strings} holds <U1 values, not real numbers" in out
    attrs = tmp_path / "e14.nc"
    bad = synth.copy()
    bad.attrs.update(complete=[1, 2, 3], mode=7)
    bad.to_netcdf(attrs, engine="h5netcdf")
    code, _, err = mlab("diff", a, attrs)
    assert code == 2 and f"cannot read capture {attrs}" in err and "[1, 2, 3]" in err, err
