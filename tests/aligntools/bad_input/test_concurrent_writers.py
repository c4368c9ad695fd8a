"""Two writers of one capture path: the second is refused, the first's journal is untouched.

Before: the second ``Tracker(out=same)`` started the journal again under the first one's
feet; the first then said "every row is kept in the journal" but ``Capture.load`` found none.
"""

from __future__ import annotations

import os

import pytest
import torch

import aligntools
from aligntools.tracker.capture_dataset import Capture
from aligntools.tracker.journal import open_store, partial_path
from aligntools.tracker.store import CaptureWriteError

IDS = torch.tensor([[5, 6, 7, 8]])


def test_a_second_writer_in_the_same_process_is_refused(llama_model, tmp_path):
    out = tmp_path / "cap.nc"
    with aligntools.Tracker(llama_model, sites="logits", out=out, flush_bytes=1) as first, torch.no_grad():
        llama_model(IDS)
        journal = sorted(p.name for p in partial_path(out).iterdir())
        with pytest.raises(CaptureWriteError, match=r"another writer \(pid \d+\) is capturing to .*cap\.nc.*"
                                                    r"another `out` path"):
            with aligntools.Tracker(llama_model, sites="logits", out=out):
                pass
        assert sorted(p.name for p in partial_path(out).iterdir()) == journal
        llama_model(IDS)
    assert first.capture.dataset.sizes["token"] == 8
    assert Capture.load(out).dataset.sizes["token"] == 8
    with aligntools.Tracker(llama_model, sites="logits", out=out), torch.no_grad():  # the lock went with it
        llama_model(IDS)
    assert Capture.load(out).dataset.sizes["token"] == 4
    assert not out.with_name(".cap.nc.lock").exists()


def test_a_writer_that_failed_lets_the_next_one_in(llama_model, tmp_path):
    out = tmp_path / "cap.zarr"
    with pytest.raises(RuntimeError, match="died"):
        with aligntools.Tracker(llama_model, sites="logits", out=out), torch.no_grad():
            raise RuntimeError("died")
    with aligntools.Tracker(llama_model, sites="logits", out=out), torch.no_grad():
        llama_model(IDS)
    assert Capture.load(out).dataset.sizes["token"] == 4


def _open_in_a_child(out) -> str:
    """What ``open_store(out)`` answers in a forked process (a fork: no second ~10 s import)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            store = open_store(out, {})  # never closed: the child dies holding it
            answer = f"opened {store.dir.name}"
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            answer = f"{type(e).__name__}: {e}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        answer = fh.read()
    os.waitpid(pid, 0)
    return answer


def test_a_second_writer_in_another_process_is_refused(llama_model, tmp_path):
    out = tmp_path / "cap.zarr"
    with aligntools.Tracker(llama_model, sites="logits", out=out, flush_bytes=1), torch.no_grad():
        llama_model(IDS)
        answer = _open_in_a_child(out)
        assert answer.startswith("CaptureWriteError") and f"another writer (pid {os.getpid()})" in answer
        llama_model(IDS)
    assert Capture.load(out).dataset.sizes["token"] == 8


def test_a_writer_that_died_without_closing_leaves_no_lock_behind(tmp_path):
    """The kernel drops an ``flock`` with its process: a killed run never blocks the next one."""
    out = tmp_path / "cap.nc"
    assert _open_in_a_child(out) == "opened .cap.nc.partial"  # the child exits (os._exit) holding its store
    assert out.with_name(".cap.nc.lock").exists()
    store = open_store(out, {})
    store.close({"complete": 0})
    assert not out.with_name(".cap.nc.lock").exists()
