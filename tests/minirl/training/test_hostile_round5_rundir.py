"""Hostile inputs, round 5 (issue 65), the run directory: a manifest's links and globs (RD), a second
run into a live out_dir (CC), a full disk at a checkpoint or a log write (DF), and kill -9 at a
checkpoint (KR). Named by the round-5 case id.

A full disk is simulated: the writer raises what a full tmpfs made it raise here (safetensors'
``SafetensorError`` "... (os error 28)", ``OSError`` ENOSPC), since mounting one needs root."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from safetensors import SafetensorError

from labs import cli
from minirl.driver import train
from minirl.training import checkpointing, run_dir, run_log
from minirl.training.run_dir import MANIFEST, RunDir, RunDirError
from tests.minirl.training.lifecycle_checks import lifecycle_config
from tests.minirl.training.test_hostile_round4_rundir import EVENT, _finished_run, _overwrite, _tree, _write_manifest

REPO = Path(__file__).resolve().parents[3]
FULL = "Error while serializing: I/O error: No space left on device (os error 28)"
SECOND_COPY = "a checkpoint is written in full beside the previous one before it replaces it, so the disk needs room " \
              "for a second copy"


# ---------------------------------------------------------------------------- the manifest (RD)
@pytest.fixture
def run(tmp_path) -> tuple[Path, Path]:
    """A finished run and a folder of the user's outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "user.txt").write_text("the user's")
    return _finished_run(tmp_path / "run"), outside


def _refused_untouched(out: Path, outside: Path, match: str) -> None:
    before, before_outside = _tree(out), _tree(outside)
    with pytest.raises(RunDirError, match=match):
        _overwrite(out)
    assert _tree(out) == before and _tree(outside) == before_outside


def test_RD21_an_event_file_under_a_linked_tensorboard_is_refused(run):
    out, outside = run
    (outside / "events.out.tfevents.1").write_text("another project's")
    shutil.rmtree(out / "tensorboard")
    (out / "tensorboard").symlink_to(outside)
    _write_manifest(out, [*run_dir.OWNED, "tensorboard/events.out.tfevents.1"])
    _refused_untouched(out, outside, r"run/tensorboard is a symlink, and a run's files are never reached through one")


@pytest.mark.parametrize("case, name, target", [("RD22", "checkpoint", ""), ("RD23", "metrics.nc", "user.txt")])
def test_RD22_RD23_a_link_where_the_run_wrote_is_refused_and_its_target_kept(run, case, name, target):
    """Refused rather than the link removed: it is not what the run left, and a new run writes that
    name (round 4's RD06 rule); nothing is removed on either side."""
    out, outside = run
    shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    (out / name).symlink_to(outside / target)
    _refused_untouched(out, outside, rf"run/{name}: it (appeared after|was replaced since) the run ended, so it may not be "
                                     rf"the run's any more.* Nothing was removed")


def test_RD24_a_literal_glob_entry_keeps_the_users_event_file(run):
    out, _ = run
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "files": [*manifest["files"],
                                                                  "tensorboard/events.out.tfevents.*"]}))
    (out / "tensorboard" / "events.out.tfevents.9.user").write_text("the user's own")
    assert "tensorboard" in _overwrite(out)
    assert (out / "tensorboard" / "events.out.tfevents.9.user").read_text() == "the user's own"
    assert not (out / EVENT).exists()  # the run's own event file went


def test_RD25_a_dotdot_entry_past_an_event_file_is_refused(run, tmp_path):
    out, outside = run
    (tmp_path / "notes.txt").write_text("notes")
    _write_manifest(out, [*run_dir.OWNED, "tensorboard/events.out.tfevents.1/../../notes.txt"])
    _refused_untouched(out, outside, r"is damaged \(entry 'tensorboard/events.out.tfevents.1/../../notes.txt' leads "
                                     r"outside out_dir\); nothing was removed")
    assert (tmp_path / "notes.txt").read_text() == "notes"


@pytest.mark.parametrize("case, name", [("RD26", "tensorboard/events.out.tfevents.2"), ("RD27", "curves.png")])
def test_RD26_RD27_a_directory_of_the_users_where_a_run_file_was_is_refused(run, case, name):
    out, outside = run
    if (out / name).exists():
        (out / name).unlink()
    (out / name).mkdir()
    (out / name / "mine.txt").write_text("the user's")
    if case == "RD26":
        manifest = json.loads((out / MANIFEST).read_text())
        (out / MANIFEST).write_text(json.dumps({**manifest, "files": [*manifest["files"], name]}))
    _refused_untouched(out, outside, rf"run/{name}: it is a directory, not what a run leaves there. Nothing was removed")


# ---------------------------------------------------------------------------- a live out_dir (CC)
@pytest.mark.parametrize("case, flags", [("CC01", []), ("CC01_overwrite", ["--overwrite"]), ("CC03", ["--resume"])])
def test_CC01_CC03_a_second_run_into_a_live_out_dir_is_told_it_is_in_use(tmp_path, capsys, case, flags):
    """Run A holds out_dir (a flock is per open file, so this process can be both A and B); B is told
    whose it is, not to use --resume or --overwrite, and A's files are as they were."""
    out = _finished_run(tmp_path / "run")
    a = RunDir.open(out, resume=True)
    before = _tree(out)
    config = tmp_path / "b.yaml"
    config.write_text(yaml.safe_dump({"model": "/nonexistent/model", "out_dir": str(out)}))
    try:
        assert cli.main(["train", "--config", str(config), *flags]) == 2
        assert _tree(out) == before
    finally:
        a.close()
    err = capsys.readouterr().err
    assert f"out_dir {out} is in use by another run (pid {os.getpid()}, holding {out / run_dir.LOCK}); wait for it " \
           f"to finish, or set another out_dir" in err, err


# ---------------------------------------------------------------------------- a full disk (DF)
def _fail_saves_after(monkeypatch, n: int) -> None:
    """Let ``n`` checkpoint writes through, then fail every later one as a full disk does."""
    real, calls = checkpointing.save_file, []

    def save_file(tensors, path, metadata=None):
        if Path(path).name == "model.safetensors":
            calls.append(path)
        if len(calls) > n:
            raise SafetensorError(FULL)
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpointing, "save_file", save_file)


def _steps(out: Path) -> list[int]:
    return run_log.load(out / "metrics.nc")["step"].values.tolist()


def test_DF01_a_full_disk_at_the_first_checkpoint_is_exit_2_naming_it(zoo, tmp_path, capsys, monkeypatch):
    _fail_saves_after(monkeypatch, 0)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(lifecycle_config(str(zoo("tiny-llama")), tmp_path / "run", "sync").to_dict()))
    assert cli.main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"no space left on the device of {tmp_path / 'run'} while writing the checkpoint " \
           f"{tmp_path / 'run' / 'checkpoint'}" in err and SECOND_COPY in err
    assert "no checkpoint was written yet: free space there (or set another out_dir) and start again" in err
    assert not any(p.name.startswith(".checkpoint.") for p in (tmp_path / "run").iterdir())  # no partial copy


def test_DF01_a_full_disk_at_a_log_write_names_the_log(tmp_path, monkeypatch):
    log = run_log.RunLog(tmp_path / "metrics.nc")
    log.append(0, {"reward": 1.0})
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError, match=rf"no space left on the device of {tmp_path} while writing the run log "
                                      rf"{tmp_path / 'metrics.nc'} \(as .metrics.nc.tmp\); the log as of the previous "
                                      rf"step is intact"):
        log.append(1, {"reward": 2.0})
    monkeypatch.undo()
    assert _steps(tmp_path) == [0] and not (tmp_path / ".metrics.nc.tmp").exists()


def test_DF02_DF05_room_for_one_checkpoint_keeps_it_and_resumes_once_freed(zoo, tmp_path, monkeypatch):
    """DF02: the second checkpoint does not fit: the first and the log up to it stay. DF03: a resume
    with no more room fails the same way, losing nothing; DF05: `mlab plot` draws the stopped run.
    DF04: with room, the resume reaches the end, each step logged once."""
    model, out = str(zoo("tiny-llama")), tmp_path / "run"
    _fail_saves_after(monkeypatch, 1)
    with pytest.raises(checkpointing.CheckpointError, match=f"{SECOND_COPY}.*the previous checkpoint and the log up "
                                                            f"to it are intact: free space there, then continue"):
        train(lifecycle_config(model, out, "sync", eval_every=0))
    logged = _steps(out)
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 1 and logged[0] == 0
    _fail_saves_after(monkeypatch, 0)
    with pytest.raises(checkpointing.CheckpointError, match=SECOND_COPY):
        train(lifecycle_config(model, out, "sync", eval_every=0), resume=True)
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 1 and _steps(out) == logged
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "curves.png")]) == 0  # DF05: the stopped run is drawn
    assert (tmp_path / "curves.png").stat().st_size > 0
    monkeypatch.undo()
    train(lifecycle_config(model, out, "sync", eval_every=0), resume=True)
    assert _steps(out) == [0, 1, 2]  # 3 steps, each once (no final evaluation: eval_every 0)


# ---------------------------------------------------------------------------- kill -9 (KR)
KILLER = textwrap.dedent("""\
    import os, signal, sys
    from pathlib import Path
    from minirl.driver import train
    from minirl.training import checkpointing
    from tests.minirl.training.lifecycle_checks import lifecycle_config

    model, out, where = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    real_save, real_rename, saves = checkpointing.save, Path.rename, []

    def save(path, *args):  # first: killed once the first checkpoint is complete
        saves.append(real_save(path, *args))
        if where == "first":
            os.kill(os.getpid(), signal.SIGKILL)
        return saves[-1]

    def rename(self, target):  # rotate: killed at the second save, its predecessor moved to .checkpoint.old
        done = real_rename(self, target)
        if where == "rotate" and Path(target).name == ".checkpoint.old":
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    checkpointing.save, Path.rename = save, rename
    train(lifecycle_config(model, out, "sync", eval_every=0))
""")


@pytest.mark.slow  # two training processes and two resumes: ~100 s each on a loaded 2-core box
@pytest.mark.parametrize("case", ["KR_first", "KR_rotate"])
def test_KR_a_run_killed_at_a_checkpoint_resumes_each_step_once(zoo, tmp_path, case):
    """kill -9 right after the first checkpoint (first), or at the second save once its predecessor
    is moved to ``.checkpoint.old`` (rotate); ``--resume`` goes on from the last complete one."""
    model, out = str(zoo("tiny-llama")), tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLER, model, str(out), case.split("_")[1]], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if case == "KR_rotate":
        assert (out / ".checkpoint.old").is_dir() and not (out / "checkpoint").exists()
    train(lifecycle_config(model, out, "sync", eval_every=0), resume=True)
    assert _steps(out) == [0, 1, 2]  # 3 steps, each once (no final evaluation: eval_every 0)
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3
