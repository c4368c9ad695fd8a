"""Hostile round 4, the run directory: a manifest that cannot reach outside its run, and a lock
that is only a lock. Each test is named by its case id; every fixture lives in a temp dir (a
character device is made with an unassigned number and never opened)."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import re
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from minirl.training import run_dir
from minirl.training.run_dir import LOCK, MANIFEST, RunDir, RunDirError

EVENT = "tensorboard/events.out.tfevents.1700000000.host.1.0"


def _finished_run(out: Path) -> Path:
    """A run as a trainer leaves it (config, log, checkpoint, curves, one event file), closed: stamped."""
    run = RunDir.open(out, resume=False)
    run.start()
    run.claim(EVENT)
    for name in ("config.yaml", "metrics.nc", "curves.png", EVENT):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(f"the run's {name}")
    (out / "checkpoint").mkdir()
    for name in run_dir.CHECKPOINT_FILES:
        (out / "checkpoint" / name).write_text("{}")
    run.close()
    return out


def _write_manifest(out: Path, files: list) -> None:
    """A manifest as the previous version wrote it (no stamps), or as a user edited it."""
    (out / MANIFEST).write_text(json.dumps({"files": files}))


def _tree(path: Path) -> dict[str, str]:
    """Every path under ``path`` (links not followed) -> its content or kind."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
                    else p.read_bytes().decode(errors="replace") if p.is_file() else "node")
    return out


def _overwrite(out: Path) -> list[str]:
    run = RunDir.open(out, resume=False, overwrite=True)
    try:
        return run.start()
    finally:
        run.close()


# ---------------------------------------------------------------------------- the manifest
@pytest.mark.parametrize("stamped", [False, True])
def test_RD02_symlinked_parent_outside_out_dir_untouched(tmp_path, stamped):
    """A manifest entry under a directory that is a link to another directory: refused, nothing
    removed on either side; the case's own entry (``shared/keep.txt``) is no name a run writes."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    (outside / EVENT.split("/")[1]).write_text("another project's event file")
    out = _finished_run(tmp_path / "run")
    if not stamped:
        _write_manifest(out, [*run_dir.OWNED, EVENT])
    (out / EVENT).unlink()
    (out / "tensorboard").rmdir()
    (out / "tensorboard").symlink_to(outside)
    before, before_outside = _tree(out), _tree(outside)
    with pytest.raises(RunDirError, match=r"run/tensorboard is a symlink, and a run's files are never reached "
                                          r"through one\. Nothing was removed"):
        _overwrite(out)
    assert _tree(out) == before and _tree(outside) == before_outside

    _write_manifest(out, ["config.yaml", "shared/keep.txt"])
    (out / "shared").symlink_to(outside)
    with pytest.raises(RunDirError, match=r"damaged \(entry 'shared/keep.txt' is not a name a run writes"):
        _overwrite(out)
    assert _tree(outside) == before_outside and (out / "config.yaml").exists()


@pytest.mark.parametrize("entry", [".", "", "config.yaml/.", "./config.yaml", "checkpoint/.", "tensorboard/",
                                   "tensorboard//events.out.tfevents.1"])
def test_RD01_dot_and_empty_parts_refused_as_damaged(tmp_path, entry):
    out = _finished_run(tmp_path / "run")
    _write_manifest(out, ["metrics.nc", entry])
    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    with pytest.raises(RunDirError, match=rf"{MANIFEST} is damaged \(entry {entry!r} is not a name a run writes "
                                          rf"\(config.yaml, .*\); nothing was removed"):
        _overwrite(out)
    assert _tree(out) == before


@pytest.mark.parametrize("entry", ["/etc/passwd", "../sibling.txt", "checkpoint/../../sibling.txt"])
def test_RD01_absolute_and_dotdot_entries_lead_outside(tmp_path, entry):
    out = _finished_run(tmp_path / "run")
    (tmp_path / "sibling.txt").write_text("beside the run")
    _write_manifest(out, ["metrics.nc", entry])
    with pytest.raises(RunDirError, match=rf"entry {re.escape(repr(entry))} leads outside out_dir"):
        _overwrite(out)
    assert (tmp_path / "sibling.txt").read_text() == "beside the run" and (out / "metrics.nc").exists()


def test_RD06_hand_listed_and_changed_files_are_not_removed(tmp_path):
    """A user's file listed by hand is no name a run writes; a run's file changed since the run
    wrote it is refused where a new run writes that name, and kept and named where none does."""
    out = _finished_run(tmp_path / "run")
    manifest = json.loads((out / MANIFEST).read_text())
    (out / "notes.txt").write_text("mine")
    _write_manifest(out, [*manifest["files"], "notes.txt"])
    with pytest.raises(RunDirError, match=r"entry 'notes.txt' is not a name a run writes"):
        _overwrite(out)
    assert (out / "notes.txt").read_text() == "mine"

    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "curves.png").write_text("my own figure, drawn over the run's")
    before = _tree(out)
    with pytest.raises(RunDirError, match=r"run/curves.png: it changed since the run wrote it, so it may not be the "
                                          r"run's any more, and a new run writes curves.png\. Nothing was removed"):
        _overwrite(out)
    assert _tree(out) == before

    (out / "curves.new").write_text("the run's curves.png")
    os.replace(out / "curves.new", out / "curves.png")  # same bytes, another file, written later: replaced
    with pytest.raises(RunDirError, match=r"curves.png: it was replaced since the run ended"):
        _overwrite(out)

    (out / "curves.png").unlink()
    with open(out / EVENT, "a") as f:
        f.write(" and a line of mine")
    kept = _overwrite(out)
    assert kept == ["notes.txt", "tensorboard", f"{EVENT} (changed since the run wrote it)"]
    assert (out / EVENT).read_text() == f"the run's {EVENT} and a line of mine"
    assert not (out / "config.yaml").exists() and not (out / "checkpoint").exists()


def test_RD06_copy_of_a_run_that_kept_its_times_is_still_the_runs(tmp_path):
    """``cp -a`` / ``rsync -a`` / ``shutil.copytree``: other inodes, the stamps' sizes and mtimes."""
    import shutil

    copy = Path(shutil.copytree(_finished_run(tmp_path / "run"), tmp_path / "copy", symlinks=True))
    assert _overwrite(copy) == []
    assert sorted(p.name for p in copy.iterdir()) == [MANIFEST, LOCK]


def test_RD12_manifest_that_is_a_symlink_is_refused(tmp_path):
    out = _finished_run(tmp_path / "run")
    (out / "keep.txt").write_text("mine")
    elsewhere = tmp_path / "other.json"
    elsewhere.write_text(json.dumps({"files": ["config.yaml"]}))
    (out / MANIFEST).unlink()
    (out / MANIFEST).symlink_to(elsewhere)
    before = _tree(out)
    for attempt in (_overwrite, lambda o: run_dir.read_manifest(o)):
        with pytest.raises(RunDirError, match=rf"{MANIFEST} is a symlink, not the manifest a run writes \(a regular "
                                              rf"file\); remove it if it is yours"):
            attempt(out)
    assert _tree(out) == before and elsewhere.exists()


def test_RD13_directory_entries_keep_files_no_run_lists(tmp_path):
    """``tensorboard`` whole is no run's entry; a checkpoint holding another file is refused (a new
    run's first save replaces it whole); unlisted files beside a run's event file stay."""
    out = _finished_run(tmp_path / "run")
    manifest = json.loads((out / MANIFEST).read_text())
    (out / "tensorboard" / "other_project").mkdir()
    (out / "tensorboard" / "other_project" / "events.keep").write_text("theirs")
    _write_manifest(out, ["config.yaml", "tensorboard"])
    with pytest.raises(RunDirError, match=r"entry 'tensorboard' is not a name a run writes"):
        _overwrite(out)

    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "checkpoint" / "my_notes.txt").write_text("mine")
    before = _tree(out)
    with pytest.raises(RunDirError, match=r"checkpoint/my_notes.txt: a checkpoint holds only model.safetensors, .*"
                                          r"a new run's first checkpoint replaces checkpoint/ whole"):
        _overwrite(out)
    assert _tree(out) == before

    (out / "checkpoint" / "my_notes.txt").unlink()
    assert _overwrite(out) == ["tensorboard"]
    assert (out / "tensorboard" / "other_project" / "events.keep").read_text() == "theirs"
    assert not (out / EVENT).exists() and not (out / "checkpoint").exists()


@pytest.mark.parametrize("entry", [" config.yaml", "config.yaml ", "config.yaml\n", f"{EVENT} "])
def test_RD19_whitespace_variants_refused(tmp_path, entry):
    out = _finished_run(tmp_path / "run")
    (out / entry).write_text("the user's, by its exact name")
    _write_manifest(out, [entry])
    with pytest.raises(RunDirError, match=rf"entry {re.escape(repr(entry))} is not a name a run writes"):
        _overwrite(out)
    assert (out / entry).read_text() == "the user's, by its exact name"


def test_RD07_oversized_manifest_refused_at_once(tmp_path):
    out = _finished_run(tmp_path / "run")
    _write_manifest(out, ["config.yaml"] * 200_000)  # 3 MB
    t = time.perf_counter()
    with pytest.raises(RunDirError, match=r"damaged \(3,000,011 bytes; a run's manifest is under 1,048,576\)"):
        _overwrite(out)
    assert time.perf_counter() - t < 0.5 and (out / "config.yaml").exists()


def test_RD20_every_entry_checked_before_any_is_removed(tmp_path):
    out = _finished_run(tmp_path / "run")
    _write_manifest(out, [*run_dir.OWNED, "tensorboard/events.out.tfevents." + "x" * 5000])
    with pytest.raises(RunDirError, match=r"entry 'tensorboard/events.out.tfevents.xxx.* is not a name a run writes"):
        _overwrite(out)
    assert (out / "config.yaml").exists() and (out / "checkpoint" / "state.json").exists()


def test_manifest_of_the_previous_version_is_overwritten_by_name(tmp_path):
    """A manifest without stamps (the previous version, or a run killed before its end) is
    replaced by name alone, which the name check keeps to what a run writes."""
    out = _finished_run(tmp_path / "run")
    _write_manifest(out, [*run_dir.OWNED, EVENT])
    (out / "curves.png").write_text("changed: no stamp says so")
    (out / "notes.txt").write_text("mine")
    assert _overwrite(out) == ["notes.txt"]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, LOCK, "notes.txt"]
    assert json.loads((out / MANIFEST).read_text())["stamps"] == {}  # closed before it wrote anything


# ---------------------------------------------------------------------------- the lock
def _refused_at_once(out: Path) -> str:
    """``RunDir.open(out)``'s refusal, which must come within 5 s (a FIFO must never block it)."""
    result: list[BaseException] = []

    def attempt():
        try:
            RunDir.open(out, resume=False).close()
        except BaseException as e:  # noqa: BLE001 - the thread reports whatever it raised
            result.append(e)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "RunDir.open blocked on the lock"
    assert result and isinstance(result[0], RunDirError), result
    return str(result[0])


def test_LK04_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    out = _finished_run(tmp_path / "run")
    target = tmp_path / "precious.txt"
    target.write_text("must survive")
    (out / LOCK).unlink()
    (out / LOCK).symlink_to(target)
    before = _tree(out)
    message = _refused_at_once(out)
    assert f"the run lock {out / LOCK} is a symlink, not the regular file a run makes" in message
    assert f"remove it (rm {out / LOCK})" in message
    assert target.read_text() == "must survive" and _tree(out) == before


def test_LK04_lock_swapped_for_a_link_after_the_check_is_never_written_through(tmp_path, monkeypatch):
    """The lstat check and the open race; ``O_NOFOLLOW`` closes it: the open itself refuses the link."""
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("must survive")
    real_lstat = os.lstat

    def link_appears_after_the_check(p, *args, **kwargs):
        if Path(p).name != LOCK:
            return real_lstat(p, *args, **kwargs)
        Path(p).symlink_to(target)  # the check finds no lock; a link is planted before the open
        raise FileNotFoundError(p)

    monkeypatch.setattr(run_dir.os, "lstat", link_appears_after_the_check)
    with pytest.raises(RunDirError, match=r"cannot open the run lock .*: Too many levels of symbolic links"):
        RunDir.open(out, resume=False)
    assert target.read_text() == "must survive"


def test_LK06_fifo_lock_held_by_another_process_is_refused_at_once(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / LOCK)
    holder = os.open(out / LOCK, os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        message = _refused_at_once(out)
    finally:
        os.close(holder)
    assert f"the run lock {out / LOCK} is a FIFO, not the regular file a run makes" in message


def _make_socket(path: Path) -> None:
    here = os.getcwd()
    os.chdir(path.parent)  # a relative name: the path may be longer than a socket address takes
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(here)


def _make_char_device(path: Path) -> None:
    """A character device with a number from the range set aside for local use (240): no driver
    answers it, and the test never opens it."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(240, 0))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD) here")


@pytest.mark.parametrize(("case", "make", "kind"), [
    ("LK02", os.mkdir, "a directory"),
    ("LK03", os.mkfifo, "a FIFO"),
    ("LK05", _make_char_device, "a character device"),
    ("LK05", _make_socket, "a socket"),
])
def test_LK02_LK03_LK05_lock_that_is_no_file_is_named_with_the_fix(tmp_path, case, make, kind):
    out = tmp_path / "run"
    out.mkdir()
    make(out / LOCK)
    message = _refused_at_once(out)
    assert message == (f"the run lock {out / LOCK} is {kind}, not the regular file a run makes; no run uses it as "
                       f"it is: remove it (rm {out / LOCK}) and start again"), case
    assert sorted(p.name for p in out.iterdir()) == [LOCK]


def test_LK09_holder_pid_printed_only_when_it_is_one(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = out / LOCK
    for content, shown in ((os.urandom(10 << 20), "pid unknown: the lock holds no pid"),
                           (b"", "pid unknown: the lock holds no pid"), (b"4242\n", "pid 4242")):
        lock.write_bytes(content)
        holder = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)
            message = _refused_at_once(out)
        finally:
            os.close(holder)
        assert f"in use by another run ({shown}, holding {lock})" in message
        assert lock.read_bytes() == content  # never truncated by the run that did not get it


def _contender(out: str, start, done, conn) -> None:
    """One trainer of the race: wait for the other, take the lock, report, hold until both tried."""
    start.wait()
    try:
        run = RunDir.open(out, resume=False)
        conn.send(("won", os.getpid()))
    except RunDirError as e:
        run = None
        conn.send(("refused", str(e)))
    done.wait()
    if run is not None:
        conn.send(("lock held", Path(out, LOCK).read_text()))
        run.close()


def test_two_trainers_overlapping_exactly_one_takes_the_lock(tmp_path):
    """Round 3's race, settled: two processes released by one barrier open one out_dir at once;
    one wins, the other is refused by the winner's pid, and the lock keeps the winner's pid."""
    ctx = multiprocessing.get_context("fork")
    for round_ in range(3):
        out = str(tmp_path / f"run{round_}")
        start, done = ctx.Barrier(2), ctx.Barrier(2)
        pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
        procs = [ctx.Process(target=_contender, args=(out, start, done, send)) for _, send in pipes]
        for p in procs:
            p.start()
        try:
            first = [recv.recv() for recv, _ in pipes]
            won = [i for i, (what, _) in enumerate(first) if what == "won"]
            assert len(won) == 1 and sorted(what for what, _ in first) == ["refused", "won"], first
            winner, refusal = first[won[0]][1], first[1 - won[0]][1]
            assert pipes[won[0]][0].recv() == ("lock held", f"{winner}\n")
        finally:
            for p in procs:
                p.join(10)
        assert f"is in use by another run (pid {winner}, holding {out}/{LOCK})" in refusal
        assert all(p.exitcode == 0 for p in procs)


# ---------------------------------------------------------------------------- round 3, still open
def test_K09_damaged_optimizer_json_is_named(tmp_path):
    """``optimizer.json`` replaced by ``[]`` (or groups of another optimizer) is named, not the
    ``optimizer.safetensors`` whose load it would make fail."""
    import torch

    from minirl.training import checkpointing

    def linear_and_sgd():
        model = torch.nn.Linear(2, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    path = checkpointing.save(tmp_path / "checkpoint", *linear_and_sgd(), {"step": 1})
    for damaged, held in (("[]", "[]"), ('[{"params": [0]}]', "[1]")):
        (path / "optimizer.json").write_text(damaged)
        with pytest.raises(checkpointing.CheckpointError,
                           match=rf"checkpoint file {path}/optimizer.json is damaged .*\(ValueError: its param groups "
                                 rf"hold {re.escape(held)} parameters, the optimizer's \[2\]\)"):
            checkpointing.load(path, *linear_and_sgd())


def test_Z08_zoo_out_under_a_dangling_symlink_is_refused_naming_it(tmp_path, capsys):
    from labs import cli

    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    t = time.perf_counter()
    code = cli.main(["zoo", "build", "tiny-qwen3-moe", "--out", str(tmp_path / "dangling" / "zoo_x")])
    assert code == 2 and time.perf_counter() - t < 5
    assert (f"cannot write zoo model to {tmp_path}/dangling/zoo_x: {tmp_path}/dangling is a symlink to "
            f"{tmp_path}/missing, which does not exist; create that directory, or give another path"
            in capsys.readouterr().err)
    assert not (tmp_path / "missing").exists()


def test_D_e14_capture_attrs_of_the_wrong_kind_are_named(tmp_path, capsys):
    """``mlab diff`` of a capture whose ``complete`` / ``mode`` hold what no writer writes."""
    import xarray as xr

    from labs import cli

    attrs = dict(engine="hf", mode="stats", dtype="float32", knobs="{}", versions="{}", model_hash="0", complete=1)
    for key, value, should in (("complete", [1, 2, 3], "0 or 1 (1 once the capture finished)"),
                               ("mode", 7, "'stats' or 'tensor' (how it was captured)")):
        bad = tmp_path / f"{key}.nc"
        xr.Dataset(attrs={**attrs, key: value}).to_netcdf(bad, engine="h5netcdf")
        assert cli.main(["diff", str(bad), str(bad)]) == 2
        shown = repr("[1, 2, 3]") if key == "complete" else "7"
        assert f"cannot read capture {bad}: attr {key!r} is {shown}; it must be {should}" in capsys.readouterr().err
