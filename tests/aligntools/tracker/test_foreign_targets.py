"""An existing HDF5 file or zarr store that is not a capture is never replaced.

Why: ``capture(out="model_weights.h5")`` and ``Capture.save("experiment.zarr")`` used to
replace anything with the HDF5 magic bytes or a ``zarr.json``: someone's weights or data set
was silently lost. Now the target must carry the attrs every capture has (``engine``,
``mode``, ``complete``); anything else, a corrupt file included, is refused byte for byte
unchanged, while an earlier capture (complete or partial) at the path is still replaced.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import aligntools
from aligntools import Capture
from aligntools.tracker.journal import partial_path
from aligntools.tracker.store import CaptureWriteError

IDS = torch.tensor([[5, 6, 7], [8, 9, 10]])


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    """A tiny random Llama from a config: no download, no zoo build."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def cap(llama) -> Capture:
    return aligntools.capture(llama, IDS, sites="logits")


def _foreign_hdf5(path: Path) -> None:
    """An HDF5 file such as Keras weights: datasets and root attrs, none of a capture's."""
    import h5py

    with h5py.File(path, "w") as f:
        f["layer0/kernel"] = np.arange(12.0).reshape(3, 4)
        f.attrs["backend"] = "tensorflow"


def _foreign_zarr(path: Path) -> None:
    """Someone's zarr data set (a group with an array and attrs)."""
    import zarr

    group = zarr.open_group(str(path), mode="w")
    group["measurements"] = np.arange(100.0)
    group.attrs["instrument"] = "probe-3"


def _corrupt_hdf5(path: Path) -> None:
    """The HDF5 magic, then garbage: an interrupted copy, a damaged disk."""
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 4)


def _corrupt_zarr(path: Path) -> None:
    """A zarr store whose root metadata is not JSON."""
    path.mkdir()
    (path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "gro')


FOREIGN: dict[str, tuple[str, Callable[[Path], None]]] = {
    "hdf5-h5": ("model_weights.h5", _foreign_hdf5),
    "hdf5-nc": ("data.nc", _foreign_hdf5),
    "zarr": ("experiment.zarr", _foreign_zarr),
    "corrupt-hdf5": ("broken.nc", _corrupt_hdf5),
    "corrupt-zarr": ("broken.zarr", _corrupt_zarr),
}


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (the target and anything a write might leave beside it)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _write_with(how: str, llama: torch.nn.Module, cap: Capture, path: Path) -> None:
    if how == "capture_out":
        aligntools.capture(llama, IDS, sites="logits", out=path)
    else:
        cap.save(path)


@pytest.mark.parametrize("how", ["capture_out", "save"])
@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_foreign_or_corrupt_target_is_refused_and_left_unchanged(llama, cap, tmp_path, kind, how):
    name, make = FOREIGN[kind]
    target = tmp_path / name
    make(target)
    before = _snapshot(tmp_path)
    with pytest.raises(CaptureWriteError) as info:
        _write_with(how, llama, cap, target)
    message = str(info.value)
    assert str(target) in message and "refusing to overwrite" in message
    assert "Choose another path" in message and "delete it yourself" in message
    assert ("cannot be read" in message) == kind.startswith("corrupt")
    assert _snapshot(tmp_path) == before  # bytes equal, no journal or temporary left beside it


@pytest.mark.parametrize("name", ["cap.nc", "cap.zarr"])
@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_an_earlier_complete_capture_is_replaced(llama, cap, tmp_path, name, mode):
    path = tmp_path / name
    aligntools.capture(llama, IDS[:1], sites="logits", mode=mode, out=path)
    aligntools.capture(llama, IDS, sites="logits", out=path)
    assert Capture.load(path).dataset.sizes["token"] == 6
    cap.save(path)
    assert Capture.load(path).mode == "tensor"
    aligntools.capture(llama, IDS[:1], sites="logits", mode="stats", out=path)
    assert Capture.load(path).dataset.sizes["token"] == 3


def _interrupt(llama: torch.nn.Module, out: Path) -> Capture:
    """A run at ``out`` that died after its first forward: the partial capture it left."""
    with pytest.raises(RuntimeError, match="died"):
        with aligntools.Tracker(llama, sites="logits", out=out, flush_bytes=1), torch.no_grad():
            llama(IDS[:1])
            raise RuntimeError("died")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "partial": expected here
        return Capture.load(out)


@pytest.mark.parametrize("name", ["cap.nc", "cap.zarr"])
def test_an_interrupted_capture_is_replaced(llama, tmp_path, name):
    path = tmp_path / name
    partial = _interrupt(llama, path)
    assert not partial.complete and partial.dataset.sizes["token"] == 3
    aligntools.capture(llama, IDS, sites="logits", out=path)
    assert Capture.load(path).complete and not partial_path(path).exists()


@pytest.mark.parametrize("name", ["saved.nc", "saved.zarr"])
def test_a_saved_partial_capture_is_replaced(llama, tmp_path, name):
    partial = _interrupt(llama, tmp_path / "run.zarr")
    path = partial.save(tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not Capture.load(path).complete  # a file with complete=0
    aligntools.capture(llama, IDS, sites="logits", out=path)
    loaded = Capture.load(path)
    assert loaded.complete and loaded.dataset.sizes["token"] == 6
