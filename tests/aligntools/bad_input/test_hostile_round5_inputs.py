"""Hostile inputs, round 5 (issue 65), the FIFO and empty-input cases round 5 left inconclusive (CLI
start-up took 26-93 s under load): each is refused at once, naming the file or site and what it is,
never a hang. The commands run in process (``mlab`` fixture); the ones where a hang is the risk
(a FIFO that an ``open`` would wait on) run in a thread given ``HANG_S``: if it is still running
then, the FIFO is opened for writing to release it and the test fails as a hang.

Named by the round-5 case id. The case list's FF row gives the range FF01-FF19 but names 16
inputs; they are numbered here in the row's order, FF01-FF16, and the three ids the row numbers
without an input go to the sibling inputs the row implies (the same input on the other command or
argument that reads it), FF17-FF19:

=====  ==================================================  ============================================
id     input                                               test
=====  ==================================================  ============================================
FF01   ``mlab diff`` with a FIFO                           ``test_FF01_diff_of_a_fifo``
FF02   ``mlab diff`` with a zero-byte file                 ``test_FF02_diff_of_a_zero_byte_file``
FF03   ``mlab diff`` with a symlink loop                   ``test_FF03_diff_of_a_symlink_loop``
FF04   ``--tolerance`` a FIFO (``mlab diff``)              ``test_FF04_diff_tolerance_of_a_fifo``
FF05   ``mlab capture --ids`` a FIFO                       ``test_FF05_capture_ids_of_a_fifo``
FF06   ``--ids`` empty, as /dev/null reads                 ``test_FF06_FF08_capture_of_empty_ids[FF06]``
FF07   ``--ids`` ``[]``                                    ``test_FF06_FF08_capture_of_empty_ids[FF07]``
FF08   ``--ids`` ``[[]]``                                  ``test_FF06_FF08_capture_of_empty_ids[FF08]``
FF09   2,000 x 32 ids with a budget                        ``test_FF09_capture_over_its_budget``
FF10   ``--text ""``                                       ``test_FF10_capture_of_empty_text``
FF11   ``--out`` a FIFO                                    ``test_FF11_capture_out_a_fifo``
FF12   ``--sites 'L99.*'``                                 ``test_FF12_capture_of_sites_no_layer_has``
FF13   ``mlab check --exclude logits --exclude L0.q``      tests/aligntools/gates/test_hostile_round5_check.py
FF14   ``mlab check --exclude 'L*'``                       ``test_FF14_...`` there
FF15   ``mlab check --infer sglang:float64``               ``...[SG01_FF15...]`` there
FF16   ``mlab check --infer hf``                           ``...[SG15_FF16...]`` there
FF17   ``--tolerance`` a FIFO (``mlab check``)             ``test_FF17_check_tolerance_of_a_fifo``
FF18   ``mlab diff`` with the FIFO as the second capture   ``test_FF18_diff_of_a_fifo_as_the_second_capture``
FF19   ``mlab capture --ids`` a symlink loop               ``test_FF19_capture_ids_of_a_symlink_loop``
=====  ==================================================  ============================================
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

HANG_S = 120.0


def _at_once(mlab, fifo: Path, *args: str) -> tuple[int, str]:
    """``mlab(*args)`` in a thread; a call still blocked after ``HANG_S`` is released and failed."""
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(result=mlab(*args)), daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader gets EOF
        thread.join(10)
        pytest.fail(f"mlab {' '.join(args)} hung on the FIFO {fifo} for {HANG_S:.0f} s")
    code, _, err = done["result"]
    return code, err


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.nc"
    os.mkfifo(path)
    return path


@pytest.fixture
def capture_file(llama, tmp_path, mlab) -> Path:
    out = tmp_path / "a.nc"
    assert mlab("capture", "--model", llama, "--text", "one two", "--sites", "logits", "--out", out)[0] == 0
    return out


def test_FF01_diff_of_a_fifo(mlab, fifo, capture_file):
    code, err = _at_once(mlab, fifo, "diff", fifo, capture_file)
    assert code == 2 and f"capture {fifo} is a FIFO, not a file or a .zarr directory" in err


def test_FF02_diff_of_a_zero_byte_file(mlab, tmp_path, capture_file):
    empty = tmp_path / "empty.nc"
    empty.touch()
    code, _, err = mlab("diff", empty, capture_file)
    assert code == 2 and f"cannot read capture {empty}" in err


def test_FF03_diff_of_a_symlink_loop(mlab, tmp_path, capture_file):
    loop = tmp_path / "loop.nc"
    loop.symlink_to(loop)
    code, _, err = mlab("diff", capture_file, loop)
    assert code == 2 and f"capture {loop}: cannot read it (Too many levels of symbolic links)" in err


def test_FF04_diff_tolerance_of_a_fifo(mlab, fifo, capture_file):
    code, err = _at_once(mlab, fifo, "diff", capture_file, capture_file, "--tolerance", fifo)
    assert code == 2 and f"--tolerance {fifo} is a FIFO, not a file; give a file" in err


def test_FF05_capture_ids_of_a_fifo(mlab, fifo, llama, tmp_path):
    code, err = _at_once(mlab, fifo, "capture", "--model", llama, "--ids", fifo, "--out", tmp_path / "o.nc")
    assert code == 2 and f"--ids {fifo} is a FIFO, not a file; give a file" in err
    assert not (tmp_path / "o.nc").exists()


@pytest.mark.parametrize("case, text, said", [
    ("FF06", "", "not JSON (Expecting value"),  # empty, as /dev/null reads
    ("FF07", "[]", "expected a JSON list of token-id lists such as [[5, 6, 7], [8, 9, 10]]; got []"),
    ("FF08", "[[]]", "request 0 is []; expected a JSON list of token-id lists"),
], ids=["FF06", "FF07", "FF08"])
def test_FF06_FF08_capture_of_empty_ids(mlab, llama, tmp_path, case, text, said):
    ids = tmp_path / "ids.json"
    ids.write_text(text)
    code, _, err = mlab("capture", "--model", llama, "--ids", ids, "--out", tmp_path / "o.nc")
    assert code == 2 and f"--ids {ids}: {said}" in err and not (tmp_path / "o.nc").exists()


def test_FF09_capture_over_its_budget(mlab, llama, tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[5 + (i + j) % 50 for j in range(32)] for i in range(2000)]))
    code, _, err = mlab("capture", "--model", llama, "--ids", ids, "--budget-bytes", 100_000, "--out",
                        tmp_path / "o.nc")
    assert code == 2 and "raise --budget-bytes or use --mode stats" in err


def test_FF10_capture_of_empty_text(mlab, llama, tmp_path):
    code, _, err = mlab("capture", "--model", llama, "--text", "", "--out", tmp_path / "o.nc")
    assert code == 2 and "--text gives no tokens; give non-empty text" in err


def test_FF11_capture_out_a_fifo(mlab, fifo, llama):
    code, err = _at_once(mlab, fifo, "capture", "--model", llama, "--text", "one two", "--out", fifo)
    assert code == 2 and f"{fifo} exists and is neither a file nor a directory; refusing to replace it" in err


def test_FF12_capture_of_sites_no_layer_has(mlab, llama, tmp_path):
    code, _, err = mlab("capture", "--model", llama, "--text", "one two", "--sites", "L99.*", "--out", tmp_path / "o.nc")
    assert code == 2 and "L99.*" in err and "L0.q" in err  # the pattern, and the sites there are


# FF17-FF19: the ids the case list's FF row numbers past its 16 inputs (the module docstring's table)
def test_FF17_check_tolerance_of_a_fifo(mlab, fifo, llama):
    code, err = _at_once(mlab, fifo, "check", "--model", llama, "--tolerance", fifo)
    assert code == 2 and f"--tolerance {fifo} is a FIFO, not a file" in err


def test_FF18_diff_of_a_fifo_as_the_second_capture(mlab, fifo, capture_file):
    code, err = _at_once(mlab, fifo, "diff", capture_file, fifo)
    assert code == 2 and f"capture {fifo} is a FIFO, not a file or a .zarr directory" in err


def test_FF19_capture_ids_of_a_symlink_loop(mlab, llama, tmp_path):
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    code, _, err = mlab("capture", "--model", llama, "--ids", loop, "--out", tmp_path / "o.nc")
    assert code == 2 and f"--ids {loop}: cannot read it (Too many levels of symbolic links)" in err
    assert not (tmp_path / "o.nc").exists()
