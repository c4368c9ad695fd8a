"""mlab capture / Capture.save never lose the user's data and size files to the data."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch
import xarray as xr

import aligntools
from aligntools import Capture
from aligntools.tracker.journal import partial_path
from aligntools.tracker.store import CaptureWriteError


@pytest.mark.parametrize("name", ["old.nc", "old.zarr"])
def test_rejected_ids_leave_the_old_capture_untouched(llama, tmp_path, mlab, name):
    out, ids = tmp_path / name, tmp_path / "ids.json"
    ids.write_text("[[5, 6, 7]]")
    assert mlab("capture", "--model", llama, "--ids", ids, "--sites", "logits", "--out", out)[0] == 0
    before = Capture.load(out).dataset.load()
    ids.write_text("[[5, 6, 99999]]")
    code, _, err = mlab("capture", "--model", llama, "--ids", ids, "--out", out)
    assert code == 2 and "99999" in err and "vocabulary" in err and len(err.strip().splitlines()) == 1
    xr.testing.assert_identical(Capture.load(out).dataset, before)
    assert not partial_path(out).exists()  # rejected before anything was opened


def test_a_failing_run_keeps_the_old_file_and_says_where_the_partial_is(llama, tmp_path, mlab):
    out, ids = tmp_path / "cap.nc", tmp_path / "ids.json"
    ids.write_text("[[5, 6, 7, 8]]")
    assert mlab("capture", "--model", llama, "--ids", ids, "--out", out)[0] == 0
    before = out.read_bytes()
    code, _, err = mlab("capture", "--model", llama, "--ids", ids, "--budget-bytes", 20000, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "budget_bytes=20000" in err and str(partial_path(out)) in err
    assert out.read_bytes() == before
    with pytest.warns(UserWarning, match="partial"):
        part = Capture.load(partial_path(out))
    assert not part.complete


def test_tiny_budget_names_the_budget_not_a_format_error(llama, tmp_path, mlab):
    code, _, err = mlab("capture", "--model", llama, "--text", "hello", "--budget-bytes", 1000,
                        "--out", tmp_path / "b.nc")
    assert code == 2 and "budget_bytes=1000" in err and "not a capture file" not in err
    with pytest.warns(UserWarning, match="partial"):
        assert Capture.load(tmp_path / "b.nc").sites == []  # the budget stopped the first site


@pytest.mark.parametrize("name", ["four.nc", "four.zarr"])
def test_small_capture_makes_a_small_file(llama_model, tmp_path, name):
    out = tmp_path / name
    with aligntools.Tracker(llama_model, out=out), torch.no_grad():
        llama_model(torch.tensor([[5, 6, 7, 8]]))
    size = sum(f.stat().st_size for f in out.rglob("*")) if out.is_dir() else out.stat().st_size
    assert size < 2 << 20  # was 345 MB (.nc) / 330 MB (.zarr): 8 MiB chunks per variable
    assert Capture.load(out).dataset["L0.q"].shape == (4, 128)


@pytest.mark.parametrize("src,dst", [("x.nc", "y.zarr"), ("x.zarr", "y.nc")])
def test_conversion_between_formats(llama_model, tmp_path, src, dst):
    cap = aligntools.capture(llama_model, torch.tensor([[5, 6, 7]]), sites="L0.q,logits", mode="stats")
    loaded = Capture.load(cap.save(tmp_path / src))
    assert type(loaded.dataset.attrs["complete"]) is int  # came back as numpy.int64 from netCDF
    again = Capture.load(loaded.save(tmp_path / dst))
    xr.testing.assert_identical(again.dataset, loaded.dataset)


def test_full_disk_is_one_error_and_the_old_file_survives(llama_model, tmp_path, monkeypatch):
    from aligntools.tracker import files

    out = tmp_path / "cap.nc"
    cap = aligntools.capture(llama_model, torch.tensor([[5, 6, 7]]), sites="logits")
    cap.save(out)
    before = out.read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.NetCDFWriter, "append", no_space)
    with pytest.raises(CaptureWriteError, match="No space left on device"):
        cap.save(out)
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["cap.nc"]  # the temporary was removed


def test_full_disk_in_the_cli_exits_2_with_one_line(llama, tmp_path, mlab, monkeypatch):
    import numpy

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(numpy, "savez", no_space)
    code, _, err = mlab("capture", "--model", llama, "--text", "hello", "--out", tmp_path / "c.nc")
    assert code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1


def test_saving_over_a_file_that_is_not_a_capture_refuses(llama_model, tmp_path):
    cap = aligntools.capture(llama_model, torch.tensor([[5, 6]]), sites="logits")
    notes = tmp_path / "notes.nc"
    notes.write_text("my notes")
    with pytest.raises(CaptureWriteError, match="not a netCDF capture"):
        cap.save(notes)
    assert notes.read_text() == "my notes"


def test_empty_site_selection_and_bad_batch_size_raise(llama_model, llama, tmp_path, mlab):
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="selects no site"):
        aligntools.capture(llama_model, ids, sites="")
    with pytest.raises(ValueError, match="batch_size"):
        aligntools.capture(llama_model, ids, batch_size=-1)
    code, _, err = mlab("capture", "--model", llama, "--text", "hi", "--sites", "", "--out", tmp_path / "e.nc")
    assert code == 2 and "selects no site" in err
    assert not (tmp_path / "e.nc").exists()


def _sparse_logits_capture(out=None) -> Capture:
    """Rows 0-3 seen at every site, logits emitted for rows 2-3 only (a vLLM-style generate
    computes logits at each request's last token)."""
    from aligntools.tracker.recorder import Recorder
    from aligntools.tracker.store import MemoryStore
    from aligntools.tracker.token_meta import TokenMeta

    meta = TokenMeta(torch.zeros(4, dtype=torch.long), torch.arange(4), torch.tensor([5, 6, 7, 8]), 0)
    last = TokenMeta(meta.request[2:], meta.position[2:], meta.token_id[2:], 0)
    attrs = {"engine": "test", "dtype": "float32", "knobs": "{}", "versions": "{}", "model_hash": "x"}
    rec = Recorder(["embed", "logits"], "tensor", MemoryStore(attrs), flush_bytes=None, progress=False)
    rec.emit("embed", torch.ones(4, 8), meta)
    rec.emit("logits", torch.ones(2, 16), last)
    rec.finish(attrs, complete=True)
    return Capture(rec.dataset())


def test_capture_marks_which_logit_rows_were_emitted(tmp_path):
    cap = _sparse_logits_capture()
    assert cap.dataset["emitted.logits"].values.tolist() == [0, 0, 1, 1]
    assert np.isnan(cap.dataset["logits"].values[:2]).all()
    assert "emitted.logits" not in cap.sites  # a coordinate, not a site
    for name in ("m.nc", "m.zarr"):
        xr.testing.assert_identical(Capture.load(cap.save(tmp_path / name)).dataset, cap.dataset)


EFBIG_CHILD = """
import resource, signal, sys, torch, transformers, aligntools
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, like a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))
try:
    with aligntools.Tracker(m, sites="L*.resid_post,logits", out=sys.argv[2], flush_bytes=1), torch.no_grad():
        m.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=30, do_sample=False, pad_token_id=0)
except OSError as e:
    print(e)
    sys.exit(2)
"""


def test_a_real_failed_netcdf_write_is_an_error_not_a_segfault(llama, tmp_path):
    """libhdf5 segfaulted (exit 139) after a failed write; the file is now built in memory."""
    import subprocess
    import sys

    out = tmp_path / "big.nc"
    proc = subprocess.run([sys.executable, "-c", EFBIG_CHILD, str(llama), str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "File too large" in proc.stdout and str(partial_path(out)) in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [partial_path(out).name]  # temporary removed
    assert Capture.load(out).dataset.sizes["token"] == 32  # every row is in the journal, complete


def test_a_disk_without_room_is_refused_before_writing(llama_model, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    cap = aligntools.capture(llama_model, torch.tensor([[5, 6, 7]]), sites="logits")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 1000))
    with pytest.raises(CaptureWriteError, match="No space left on device: needs about"):
        cap.save(tmp_path / "c.zarr")
    assert list(tmp_path.iterdir()) == []
