"""The run directory is safe: a run deletes and overwrites only what it wrote (its manifest), one run
at a time holds it (a lock that ``kill -9`` releases, with or without HDF5 file locking), and each
refusal gives the real reason and a fix that loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labs import cli
from minirl.training import run_dir
from minirl.training.train_config import TrainConfig


@pytest.fixture(scope="module")
def model(zoo):
    return str(zoo("tiny-qwen3"))


@pytest.fixture
def mlab_train(model, tmp_path, capsys):
    """``mlab_train(out_dir, *flags, **config) -> (exit code, stderr)``: a 1-step run, 1 held-out problem."""

    def run(out_dir, *flags, **changes):
        values = {**dict(model=model, sft_steps=0, prompts_per_step=2, group_size=2, max_new_tokens=2, steps=1,
                         minibatches=1, n_train=4, n_eval=1, eval_every=1, checkpoint_every=1, progress=False,
                         out_dir=str(out_dir)), **changes}
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(values))
        code = cli.main(["train", "--config", str(path), *flags])
        return code, capsys.readouterr().err

    return run


def _snapshot(path):
    return {str(p.relative_to(path)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(path.rglob("*"))}


def test_foreign_files_are_refused_and_overwrite_removes_only_the_runs_own(mlab_train, tmp_path):
    """C38: a user's config.yaml and tensorboard/ are not a run; C38b: --overwrite keeps them."""
    out = tmp_path / "out"
    (out / "tensorboard" / "other_project").mkdir(parents=True)
    (out / "tensorboard" / "other_project" / "events.keep").write_text("theirs")
    (out / "config.yaml").write_text("mine: true\n")
    before = _snapshot(out)
    for flags in ((), ("--overwrite",)):
        code, err = mlab_train(out, *flags)
        assert code == 2 and "has files no run wrote there (config.yaml; no .mlab-run.json)" in err
        assert "set another out_dir" in err and "delete" not in err and "--overwrite" not in err
        assert _snapshot(out) == before

    (out / "config.yaml").unlink()  # the collision gone, a run may share the directory
    assert mlab_train(out, report_to="tensorboard")[0] == 0
    (out / "notes.txt").write_text("mine")
    code, err = mlab_train(out, "--overwrite", report_to="tensorboard")
    assert code == 0 and "kept files this run did not write: notes.txt, tensorboard" in err
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "tensorboard" / "other_project" / "events.keep").read_text() == "theirs"
    assert len([f for f in run_dir.read_manifest(out) if f.startswith("tensorboard/")]) == 1  # the first run's went


def test_a_file_dropped_in_tensorboard_as_the_writer_opens_is_not_claimed(mlab_train, tmp_path, monkeypatch):
    """Only the event files the writer makes are the run's: a file another process drops in
    tensorboard/ at that moment neither crashes the run (a name no run writes) nor is removed later."""
    from torch.utils import tensorboard

    class Crowded(tensorboard.SummaryWriter):
        def __init__(self, log_dir, **kw):
            super().__init__(log_dir, **kw)
            (Path(log_dir) / "their_notes.txt").write_text("theirs")

    monkeypatch.setattr(tensorboard, "SummaryWriter", Crowded)
    out = tmp_path / "out"
    assert mlab_train(out, report_to="tensorboard")[0] == 0
    claimed = [f for f in run_dir.read_manifest(out) if f.startswith("tensorboard/")]
    assert len(claimed) == 1 and claimed[0].startswith("tensorboard/events.out.tfevents.")
    assert mlab_train(out, "--overwrite", report_to="tensorboard")[0] == 0
    assert (out / "tensorboard" / "their_notes.txt").read_text() == "theirs"


def test_out_dir_empty_is_refused(mlab_train, tmp_path, monkeypatch):
    """C39: ``out_dir: ''`` would write the run into the working directory."""
    monkeypatch.chdir(tmp_path)
    code, err = mlab_train("")
    assert code == 2 and "out_dir='': must not be empty" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


def test_resume_refusals_give_the_real_reason(mlab_train, tmp_path):
    """R15: --resume with no run; R12: checkpoint/ replaced by a file; checkpoint_every: 0 named as such."""
    code, err = mlab_train(tmp_path / "nothing", "--resume")
    assert code == 2 and "holds no run (no .mlab-run.json), so there is nothing to resume; drop --resume" in err
    assert not (tmp_path / "nothing").exists()

    out = tmp_path / "run"
    assert mlab_train(out)[0] == 0
    import shutil

    shutil.rmtree(out / "checkpoint")
    (out / "checkpoint").write_text("not a checkpoint")
    code, err = mlab_train(out, "--resume")
    assert code == 2 and "checkpoint is a file, not a checkpoint directory" in err and "checkpoint_every" not in err

    assert mlab_train(tmp_path / "never", checkpoint_every=0)[0] == 0
    code, err = mlab_train(tmp_path / "never", "--resume", checkpoint_every=0)
    assert code == 2 and "no checkpoint to continue (its config has checkpoint_every: 0, which writes none)" in err


REPO = Path(__file__).resolve().parents[3]
HOLD = """
import sys, time
from minirl.training.run_dir import RunDir
RunDir.open(sys.argv[1], resume=sys.argv[2] == "resume")
print("held", flush=True)
time.sleep(600)
"""


def _holder(out_dir, resume: bool) -> subprocess.Popen:
    """Another process holding ``out_dir``'s lock, as a running trainer does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out_dir), "resume" if resume else "new"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("hdf5_locking", ["TRUE", "FALSE"])
def test_second_run_on_one_out_dir_is_refused_by_name_before_any_file_changes(mlab_train, tmp_path, monkeypatch,
                                                                              hdf5_locking):
    """CC1-CC5: a fresh run, a --resume and an --overwrite beside a running one are refused naming
    its pid, with HDF5 file locking on or off; the directory is untouched; kill -9 frees it."""
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", hdf5_locking)
    out = tmp_path / "out"
    assert mlab_train(out)[0] == 0
    holder = _holder(out, resume=True)
    try:
        before = _snapshot(out)
        for flags in (("--resume",), ("--overwrite",)):
            code, err = mlab_train(out, *flags, lr=0.01)
            assert code == 2 and f"is in use by another run (pid {holder.pid}" in err, err
            assert _snapshot(out) == before
        fresh = tmp_path / "fresh"
        other = _holder(fresh, resume=False)
        code, err = mlab_train(fresh)
        assert code == 2 and f"in use by another run (pid {other.pid}" in err
        other.kill()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    code, err = mlab_train(out, "--resume", steps=2)
    assert code == 0, err
    held = run_dir.RunDir.open(out, resume=True)  # and released when the run ended
    held.close()


def test_unknown_engine_is_refused_before_any_model_loads(mlab_train, tmp_path):
    """#37 item 5: exit 2 naming the valid kinds; nothing written (no model was read)."""
    code, err = mlab_train(tmp_path / "out", engine="vlm", model=str(tmp_path / "no-model-here"))
    assert code == 2 and "engine: engine spec 'vlm': unknown engine 'vlm'; engines here: minirl, vllm" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="not a minirl preset"):
        TrainConfig(engine="minirl:typo")


def test_the_step_bar_names_the_run(mlab_train, tmp_path):
    """A long entry trains several runs one after another (the collapse entry: five arms, hours); a
    bar reading "minirl train 37/200" does not say which of them is at step 37."""
    code, err = mlab_train(tmp_path / "icepop_seed1", progress=True)
    assert code == 0 and "minirl train icepop_seed1: 100%" in err
