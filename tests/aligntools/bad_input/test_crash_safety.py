"""A streaming capture killed at any moment (SIGKILL, SIGTERM) keeps every flushed row readable.

One child process imports torch once and forks a capturing worker per case (imports cost ~10 s
on the shared CI box); each worker is killed once its journal lists a given number of rows.
"""

from __future__ import annotations

import json
import os
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
import json, os, sys, time, torch, transformers, aligntools
torch.set_num_threads(1)  # fork-safe: no OpenMP pool shared with the workers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
slow = lambda ids, scores: (time.sleep(0.02), scores)[1]
pids = []
for out in sys.argv[2:]:
    pid = os.fork()
    if pid == 0:
        with aligntools.Tracker(m, sites="L0.resid_post,L3.resid_post,logits", out=out, flush_bytes=1):
            with torch.no_grad():
                m.generate(torch.tensor([[5, 6, 7], [8, 9, 10]]), max_new_tokens=400, min_new_tokens=400,
                           do_sample=False, pad_token_id=0, logits_processor=[slow])
        os._exit(0)
    pids.append(pid)
print(json.dumps(pids), flush=True)
print(json.dumps([os.waitpid(p, 0)[1] for p in pids]), flush=True)
"""
# (file, signal, kill once the journal lists this many rows): early, mid-prefill-flush, later
CASES = [("k.nc", signal.SIGKILL, 6), ("k.zarr", signal.SIGKILL, 40), ("t.nc", signal.SIGTERM, 20),
         ("t.zarr", signal.SIGTERM, 6), ("old.nc", signal.SIGKILL, 10)]


def _rows(journal: Path) -> int:
    try:
        return json.loads((journal / "journal.json").read_text())["n_rows"]
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def killed(zoo, tmp_path_factory) -> tuple[Path, bytes]:
    """Runs every case; returns the folder and the bytes of the old capture at old.nc."""
    from labs.cli import main

    root = tmp_path_factory.mktemp("killed")
    ids = root / "ids.json"
    ids.write_text("[[5, 6, 7]]")
    assert main(["capture", "--model", str(zoo("tiny-llama")), "--ids", str(ids), "--sites", "logits",
                 "--out", str(root / "old.nc")]) == 0
    old = (root / "old.nc").read_bytes()
    outs = [root / name for name, _, _ in CASES]
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(zoo("tiny-llama")), *map(str, outs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = json.loads(proc.stdout.readline() or "null")
        assert pids, proc.stderr.read()[-2000:]
        todo = {pid: (partial_path(out), sig, n) for pid, out, (_, sig, n) in zip(pids, outs, CASES)}
        end = time.monotonic() + 120
        while todo and time.monotonic() < end:
            for pid, (journal, sig, n) in list(todo.items()):
                if _rows(journal) >= n:
                    os.kill(pid, sig)
                    del todo[pid]
            time.sleep(0.01)
        assert not todo, f"workers never reached their row counts: {todo}"
        statuses = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    assert [os.waitstatus_to_exitcode(s) for s in statuses] == [-sig for _, sig, _ in CASES]
    return root, old


@pytest.mark.parametrize("name,rows", [(name, n) for name, _, n in CASES[:4]])
def test_killed_capture_loads_every_flushed_row_marked_partial(killed, name, rows):
    root, _ = killed
    with pytest.warns(UserWarning, match="partial"):
        cap = Capture.load(root / name)
    assert not cap.complete
    ds = cap.dataset
    assert ds.sizes["token"] >= rows
    assert ds["step"].values[:6].tolist() == [0] * 6  # the prompt rows came first
    assert np.isfinite(ds["L0.resid_post"].values).all()  # every listed row was fully written
    assert not (root / name).exists()  # nothing half-written at the path the user asked for


def test_kill_keeps_an_older_capture_at_the_same_path(killed):
    """A run that did not finish never touches the file it would have replaced."""
    root, old = killed
    out = root / "old.nc"
    assert out.read_bytes() == old
    with pytest.warns(UserWarning, match="unfinished"):
        assert Capture.load(out).complete
    with pytest.warns(UserWarning, match="partial"):
        assert not Capture.load(partial_path(out)).complete
