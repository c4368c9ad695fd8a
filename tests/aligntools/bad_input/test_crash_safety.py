"""A streaming capture killed at any moment (SIGKILL, SIGTERM) keeps every flushed row readable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from aligntools import Capture
from aligntools.tracker.journal import partial_path

CHILD = """
import sys, time, torch, transformers, aligntools
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
slow = lambda ids, scores: (time.sleep(0.02), scores)[1]
with aligntools.Tracker(m, sites="L0.resid_post,L3.resid_post,logits", out=sys.argv[2], flush_bytes=1), torch.no_grad():
    m.generate(torch.tensor([[5, 6, 7], [8, 9, 10]]), max_new_tokens=400, min_new_tokens=400,
               do_sample=False, pad_token_id=0, logits_processor=[slow])
"""


def _wait_rows(journal: Path, at_least: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if json.loads((journal / "journal.json").read_text())["n_rows"] >= at_least:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"the child wrote no {at_least} rows to {journal} in {timeout} s")


@pytest.mark.parametrize("name,sig,rows", [("k.nc", signal.SIGKILL, 6), ("k.zarr", signal.SIGKILL, 40),
                                           ("t.nc", signal.SIGTERM, 20), ("t.zarr", signal.SIGTERM, 6)])
def test_killed_capture_loads_every_flushed_row_marked_partial(zoo, tmp_path, name, sig, rows):
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(zoo("tiny-llama")), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_rows(partial_path(out), rows)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
    finally:
        proc.kill()
    with pytest.warns(UserWarning, match="partial"):
        cap = Capture.load(out)
    assert not cap.complete
    ds = cap.dataset
    assert ds.sizes["token"] >= rows
    assert ds["step"].values[:3].tolist() == [0, 0, 0]  # the prompt rows came first
    assert np.isfinite(ds["L0.resid_post"].values).all()  # every listed row was fully written
    assert not out.exists()  # nothing half-written at the path the user asked for


def test_kill_keeps_an_older_capture_at_the_same_path(zoo, tmp_path, capsys):
    """A run that did not finish never touches the file it would have replaced."""
    from labs.cli import main

    out = tmp_path / "old.nc"
    ids = tmp_path / "ids.json"
    ids.write_text("[[5, 6, 7]]")
    assert main(["capture", "--model", str(zoo("tiny-llama")), "--ids", str(ids), "--sites", "logits",
                 "--out", str(out)]) == 0
    before = out.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(zoo("tiny-llama")), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_rows(partial_path(out), 6)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert out.read_bytes() == before
    with pytest.warns(UserWarning, match="unfinished"):
        assert Capture.load(out).complete
    with pytest.warns(UserWarning, match="partial"):
        assert not Capture.load(partial_path(out)).complete
