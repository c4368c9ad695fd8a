"""Capture files: round trips, streaming partial files, corrupt files, unwritable paths."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import xarray as xr

import aligntools
from aligntools import Capture, CaptureFileError
from aligntools.tracker.store import CaptureWriteError

FORMATS = ["cap.zarr", "cap.nc"]  # h5py is pinned: netCDF is a core format, never skipped


@pytest.fixture(scope="module")
def caps(hf_model):
    ids = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(3))
    model = hf_model("tiny-qwen3-moe")
    return {mode: aligntools.capture(model, ids, mode=mode) for mode in ("tensor", "stats")}


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_save_load_round_trips_exactly(caps, tmp_path, name, mode):
    cap = caps[mode]
    loaded = Capture.load(cap.save(tmp_path / name))
    xr.testing.assert_identical(loaded.dataset, cap.dataset)
    assert loaded.sites == cap.sites and loaded.complete and loaded.mode == mode
    assert loaded.dataset["L0.topk_ids"].dtype == (np.int64 if mode == "tensor" else np.float64)


def test_streaming_exception_leaves_partial_file(hf_model, tmp_path):
    model = hf_model("tiny-llama")
    out = tmp_path / "stream.zarr"
    calls: list[int] = []

    def crash_on_second_call(module, args, output):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("simulated crash")

    boom = model.model.layers[2].register_forward_hook(crash_on_second_call)
    with pytest.raises(RuntimeError, match="simulated crash"):
        with aligntools.Tracker(model, sites="L*.resid_post,logits", out=out, flush_bytes=1) as t, torch.no_grad():
            model(torch.tensor([[5, 6, 7]]))  # completes
            model(torch.tensor([[8, 9]]))  # dies inside layer 2
    boom.remove()
    with pytest.warns(UserWarning, match="partial"):
        part = Capture.load(out)
    assert not part.complete and not t.capture.complete
    ds = part.dataset
    assert list(ds["request"].values) == [0, 0, 0, 1, 1]
    assert not np.isnan(ds["L1.resid_post"].values).any()  # layers before the crash were kept
    assert np.isnan(ds["L3.resid_post"].values[3:]).all()  # the rest of the dying call never ran


def test_hard_crash_mid_capture_leaves_readable_file(tmp_path, zoo):
    """A process killed (os._exit) mid-capture: the steps flushed before are readable."""
    out = tmp_path / "crash.zarr"
    script = textwrap.dedent(f"""
        import os, torch, transformers, aligntools
        m = transformers.AutoModelForCausalLM.from_pretrained({str(zoo("tiny-llama"))!r})
        with aligntools.Tracker(m, sites="L0.resid_post,logits", out={str(out)!r}, flush_bytes=1):
            with torch.no_grad():
                m.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=5, do_sample=False, pad_token_id=0,
                           logits_processor=[lambda ids, s: os._exit(3) if ids.shape[1] >= 6 else s])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    with pytest.warns(UserWarning, match="partial"):
        part = Capture.load(out)
    assert not part.complete
    steps = part.dataset["step"].values.tolist()
    assert steps[:3] == [0, 0, 0] and 0 < len(steps) < 8


def test_loading_corrupt_files_raises_clear_error(caps, tmp_path):
    garbage = tmp_path / "garbage.nc"
    garbage.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 50)
    with pytest.raises(CaptureFileError, match="garbage.nc"):
        Capture.load(garbage)
    path = caps["tensor"].save(tmp_path / "trunc.zarr")
    meta = path / "L0.q" / "zarr.json"
    meta.write_text(meta.read_text()[:40])  # truncated metadata
    with pytest.raises(CaptureFileError, match="trunc.zarr"):
        Capture.load(path)
    notcap = tmp_path / "other.zarr"
    xr.Dataset({"x": ("t", np.arange(3))}).to_zarr(notcap, consolidated=False)
    with pytest.raises(CaptureFileError, match="not a capture file"):
        Capture.load(notcap)
    with pytest.raises(FileNotFoundError):
        Capture.load(tmp_path / "missing.zarr")


def test_unwritable_path_fails_before_running(hf_model, tmp_path):
    model = hf_model("tiny-llama")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    ran = []
    handle = model.register_forward_pre_hook(lambda m, a: ran.append(1))
    with pytest.raises(CaptureWriteError, match="a_file"):
        with aligntools.Tracker(model, sites="logits", out=blocker / "cap.zarr"):
            model(torch.tensor([[5, 6]]))
    handle.remove()
    assert ran == []


def test_version_mismatch_is_noted_on_load(caps, tmp_path):
    cap = caps["stats"]
    old = Capture(cap.dataset.copy())
    old.dataset.attrs["versions"] = json.dumps({**cap.versions, "torch": "1.0.0"})
    loaded = Capture.load(old.save(tmp_path / "old.zarr"))
    assert json.loads(loaded.dataset.attrs["version_mismatch"]) == {"torch": ["1.0.0", cap.versions["torch"]]}
    assert "version_mismatch" not in Capture.load(cap.save(tmp_path / "same.zarr")).dataset.attrs


def test_attrs_follow_the_contract(caps, zoo):
    from labs.zoo import weights_hash

    ds = caps["tensor"].dataset
    for key in ("engine", "mode", "dtype", "knobs", "versions", "model_hash", "complete"):
        assert key in ds.attrs
    assert ds.attrs["model_hash"] == weights_hash(zoo("tiny-qwen3-moe"))
    assert ds["L0.q"].attrs["dtype"] == "float32" and ds["L0.q"].dtype == np.float32


def test_saving_into_a_plain_directory_refuses_and_keeps_its_files(caps, tmp_path):
    keep = tmp_path / "runs"
    keep.mkdir()
    (keep / "important.txt").write_text("user data")
    with pytest.raises(CaptureWriteError, match="not a zarr capture"):
        caps["tensor"].save(keep)
    assert (keep / "important.txt").read_text() == "user data"


def test_lazy_capture_saved_over_its_own_zarr_keeps_its_data(caps, tmp_path):
    path = tmp_path / "cap.zarr"
    caps["tensor"].save(path)
    Capture.load(path, lazy=True).save(path)
    xr.testing.assert_identical(Capture.load(path).dataset, caps["tensor"].dataset)
