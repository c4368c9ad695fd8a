"""Runs you can trust and see: resume applies or refuses each changed value, a run directory is
never silently replaced, Ctrl-C says what is intact, an interrupted run of a tied-embedding model
resumes bit-exactly, and ``mlab plot`` overlays runs in one figure."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from labs import cli
from minirl.training import resume, run_dir, run_log
from minirl import tasks
from minirl.training.checkpointing import CheckpointError
from minirl.training.resume import RunInterrupted
from minirl.training.train_config import TrainConfig
from minirl.driver import train
from minirl.training.trainer import Trainer
from tests.minirl.training.tied_model import build_tied


class Parity:
    """Reward = parity of the completion's characters: mixed rewards from an untrained model, so
    every step has non-zero advantages and really moves the weights."""

    name = "parity"

    def __init__(self, **_):
        self.inner = tasks.get("arithmetic", digits=1)

    def sample(self, rng):
        return self.inner.sample(rng)

    def verify(self, problem, completion):
        return sum(map(ord, completion)) % 2 == 0


tasks.register("parity", Parity)


@pytest.fixture(scope="module")
def tied(zoo, tmp_path_factory):
    return build_tied(zoo("tiny-llama"), tmp_path_factory.mktemp("tied") / "tied-llama")


BASE = dict(sft_steps=0, task="parity", n_train=8, n_eval=2, prompts_per_step=2, group_size=4, max_new_tokens=4,
            steps=2, eval_every=0, checkpoint_every=1, minibatches=1, lr=1e-2, progress=False)


@pytest.fixture
def config(tied, tmp_path):
    def make(name="run", **changes):
        return TrainConfig(**{**BASE, "model": str(tied), "out_dir": str(tmp_path / name), **changes})

    return make


def _interrupt_at(monkeypatch, at: int) -> None:
    real = Trainer.train_step

    def step(self, step):
        if step == at:
            raise KeyboardInterrupt
        return real(self, step)

    monkeypatch.setattr(Trainer, "train_step", step)


def _comparable(rows):
    """Rows without timings, NaN as a string (NaN != NaN would fail an exact comparison)."""
    return [{k: "nan" if v != v else v for k, v in r.items() if not k.startswith("time_")} for r in rows]


def test_interrupted_tied_model_run_resumes_bit_exactly(config, monkeypatch):
    full = train(config("full", steps=3))
    _interrupt_at(monkeypatch, 2)
    with pytest.raises(RunInterrupted, match=r"^interrupted at step 2; the checkpoint at step 2 is intact; resume "
                                             r"with --resume$"):
        train(config("part", steps=3))
    monkeypatch.undo()
    resumed = train(config("part", steps=3), resume=True)
    assert _comparable(resumed.rows) == _comparable(full.rows) and len(full.rows) == 3
    assert any(r["grad_norm"] > 0 for r in full.rows)  # the weights really moved
    assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.fixture(scope="module")
def base_run(tied, tmp_path_factory):
    out = tmp_path_factory.mktemp("base") / "base"
    train(TrainConfig(**{**BASE, "model": str(tied), "out_dir": str(out)}))
    return out


@pytest.fixture
def finished(base_run, tmp_path):
    """``copy(name)``: a private copy of a finished 2-step run (checkpoint at step 2) in ``tmp_path/name``
    (a moved run directory: ``out_dir`` is a value a resume may change)."""

    def copy(name):
        shutil.copytree(base_run, tmp_path / name)
        return name

    return copy


def test_changed_lr_on_resume_trains_at_the_new_lr(config, finished):
    """Same weights, optimizer state and rollouts at step 2: one AdamW step moves each weight by
    lr * m_hat / (sqrt(v_hat) + eps), so lr 0.05 moves it exactly 5x as far as lr 0.01."""
    start = Trainer(config(finished("same"), steps=3))
    before = {k: v.clone() for k, v in _restored(start).items()}
    same = start.run(resume=True)
    faster = Trainer(config(finished("faster"), steps=3, lr=5e-2))
    faster.run(resume=True)
    assert [g["lr"] for g in faster.opt.param_groups] == [5e-2]
    slow_delta = torch.cat([(same.model.state_dict()[k] - v).flatten() for k, v in before.items()])
    fast_delta = torch.cat([(faster.model.state_dict()[k] - v).flatten() for k, v in before.items()])
    assert slow_delta.abs().max() > 0
    torch.testing.assert_close(fast_delta, 5 * slow_delta, rtol=1e-3, atol=1e-6)
    log = run_log.load(faster.log.path)
    assert log["lr"].values.tolist() == [1e-2, 1e-2, 5e-2]
    assert {"step": 2, "event": "lr changed on resume at step 2: 0.01 -> 0.05"} in run_log.events(log)


def _restored(trainer):
    import transformers

    ckpt = transformers.AutoModelForCausalLM.from_pretrained(trainer.cfg.model)
    opt = torch.optim.AdamW(ckpt.parameters())
    from minirl.training import checkpointing

    checkpointing.load(trainer.out / "checkpoint", ckpt, opt)
    return ckpt.state_dict()


@pytest.mark.parametrize("changes, message", [
    (dict(seed=1), "--resume would change seed (seed: 0 -> 1)"),
    (dict(group_size=2), "--resume would change group_size (group_size: 4 -> 2)"),
    (dict(task_kwargs={"digits": 2}), "--resume would change task_kwargs ({'digits': 1} -> {'digits': 2})"),
    (dict(engine="minirl:aligned"), "--resume would change engine"),
])
def test_resume_refuses_changes_to_what_was_computed(changes, message):
    base = dict(model="/m", group_size=4, minibatches=1)
    saved = TrainConfig(**base).to_dict()
    with pytest.raises(ValueError) as err:
        resume.changes(saved, TrainConfig(**{**base, **changes}).to_dict(), same_model=True)
    assert message.replace("({", "(task_kwargs: {") in str(err.value)
    assert "A resume may change only: steps" in str(err.value)
    applied = resume.changes(saved, TrainConfig(**{**base, "model": "/moved", "lr": 1.0, "steps": 20}).to_dict(),
                             same_model=True)
    assert applied == {"lr": (2e-4, 1.0), "steps": (10, 20)}


def test_resume_with_another_model_is_refused(config, finished, tied, tmp_path):
    other = tmp_path / "other"  # same architecture and files, different weights
    shutil.copytree(tied, other)
    from safetensors.torch import load_file, save_file

    weights = load_file(other / "model.safetensors")
    weights["model.norm.weight"] += 1
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="--resume would change model .*the weights differ from the checkpoint"):
        train(config(finished("moved"), model=str(other)), resume=True)


@pytest.mark.parametrize("mode", ["sync", "ray"])
def test_a_refused_resume_is_refused_before_any_model_loads_or_worker_starts(config, finished, monkeypatch, mode):
    """The refusal reads the checkpoint's state.json alone: in ``mode: ray`` it used to start every
    actor first (~12 s on 2 cores), in ``sync`` to load the model and build the engine."""
    from minirl import driver

    def loads(*args, **kwargs):
        raise AssertionError("a model loaded or a worker started before the refusal")

    monkeypatch.setattr(driver, "Trainer", loads)
    monkeypatch.setattr(driver.async_loop, "run", loads)
    name = finished(f"refused-{mode}")
    with pytest.raises(ValueError, match=r"--resume would change seed(, mode)? \(seed: 0 -> 5"):
        train(config(name, steps=3, seed=5, mode=mode), resume=True)
    with pytest.raises(ValueError, match=r"steps=1, but the checkpoint in .* is already at step 2; set steps >= 2"):
        train(config(name, steps=1), resume=True)


@pytest.mark.parametrize("step", [-5, 10**6, "2"])
def test_checkpoint_step_outside_the_run_is_refused(config, finished, step):
    name = finished("tampered")
    state_file = config(name).out_dir + "/checkpoint/state.json"
    with open(state_file) as f:
        state = json.load(f)
    with open(state_file, "w") as f:
        json.dump({**state, "step": step}, f)
    with pytest.raises(CheckpointError, match=f"{state_file}: step={step!r} with 2 metric rows"):
        train(config(name, steps=3), resume=True)


def test_runaway_lr_stop_does_not_claim_a_checkpoint(config, tmp_path):
    with pytest.raises(RuntimeError) as err:
        train(config(lr=1e30, steps=8, checkpoint_every=20, max_nan_steps=1))
    assert "No checkpoint was written (checkpoint_every=20)" in str(err.value) and "intact" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_cli_refuses_existing_run_and_ctrl_c_is_one_line(config, tmp_path, monkeypatch, capsys):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config().to_dict()))
    assert cli.main(["train", "--config", str(path), "--set", "steps=1"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--config", str(path)]) == 2
    assert "already holds a run (config.yaml, metrics.nc, checkpoint, curves.png); continue it with --resume, " \
           "replace it with --overwrite (only the run's own files)" in capsys.readouterr().err
    _interrupt_at(monkeypatch, 1)
    assert cli.main(["train", "--config", str(path), "--overwrite"]) == 130
    err = capsys.readouterr().err  # one line (bars, if any, before it); no traceback
    assert err.splitlines()[-1] == ("mlab train: interrupted at step 1; the checkpoint at step 1 is intact; "
                                    "resume with --resume") and "Traceback" not in err
    monkeypatch.undo()
    assert cli.main(["train", "--config", str(path), "--resume"]) == 0
    assert "done: 2 steps" in capsys.readouterr().out


def test_mlab_plot_overlays_three_runs(config, tmp_path):
    from matplotlib.image import imread

    runs = [train(config(f"run-{c}", correction=c, steps=1, checkpoint_every=0,
                         report_to="tensorboard" if c == "tis" else "none")).out_dir
            for c in ("none", "tis", "icepop")]
    assert run_dir.read_manifest(runs[0]) == list(run_dir.OWNED)
    assert [f for f in run_dir.read_manifest(runs[1]) if f.startswith("tensorboard/events.out.tfevents.")]
    from minirl.training.plot import legend_labels

    assert legend_labels(runs) == ["correction=none", "correction=tis", "correction=icepop"]
    png = tmp_path / "fig.png"
    assert cli.main(["plot", *map(str, runs), "--out", str(png)]) == 0
    img = imread(png)[..., :3]
    assert img.shape[0] > 300 and img.shape[1] > 600
    assert img.std() > 0.05 and len({tuple(p) for p in img.reshape(-1, 3)[::7].round(2).tolist()}) > 50
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(runs[1] / "tensorboard"))
    board.Reload()
    logged = run_log.load(runs[1] / "metrics.nc")["reward"].values.tolist()
    assert [e.value for e in board.Scalars("reward")] == pytest.approx(logged) and len(logged) == 1
