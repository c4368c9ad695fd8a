"""A researcher's own task runs from ``mlab train`` (docs/rl.md, "Adding a task"): by import path or by a
name a ``setup_modules`` module registers, and held-out accuracy counts exact answers, not partial
credit. ``mode: ray`` runs the same example in ``tests/minirl/scale_out/test_ray_lifecycle.py``."""

from __future__ import annotations

import math
import sys

import pytest
import yaml

from labs import cli
from minirl import tasks
from minirl.training import run_log
from minirl.driver import train
from minirl.training.train_config import TrainConfig
from tests.minirl.tasks.example_task import write_example

RUN = dict(sft_steps=0, prompts_per_step=2, group_size=2, max_new_tokens=3, steps=1, minibatches=1, n_train=8,
           n_eval=4, eval_every=1, checkpoint_every=0, progress=False)


@pytest.fixture
def my_tasks(tmp_path, monkeypatch):
    """docs/rl.md's example saved as ``my_tasks.py`` on the path, imported fresh by each test."""
    write_example(tmp_path / "pkg")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    monkeypatch.delitem(sys.modules, "my_tasks", raising=False)
    return "my_tasks"


def test_example_task_runs_from_mlab_train_by_registered_name(zoo, tmp_path, my_tasks, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**RUN, "model": str(zoo("tiny-qwen3")), "out_dir": str(tmp_path / "out"),
                                    "setup_modules": [my_tasks], "task": "doubling",
                                    "task_kwargs": {"max_number": 50}}))
    assert cli.main(["train", "--config", str(path)]) == 0, capsys.readouterr().err
    log = run_log.load(tmp_path / "out" / "metrics.nc")
    assert log["step"].values.tolist() == [0, 1]  # step 0's evaluation, then the final policy's
    for accuracy, reward in zip(log["eval_accuracy"].values, log["eval_reward"].values):
        assert 0 <= accuracy <= reward <= 1 and not math.isnan(reward)


def test_example_task_by_import_path_and_its_exact_correctness(my_tasks):
    task = tasks.get(f"{my_tasks}:Doubling", max_number=3)
    problem = tasks.Problem("Q: 2+2= A:", "4", {"value": 4})
    assert [task.verify(problem, c) for c in (" 4", " 5", " four")] == [1.0, 0.2, 0.0]
    assert [tasks.is_correct(task, problem, c) for c in (" 4", " 5", " four")] == [True, False, False]
    config = TrainConfig(model="m", task=f"{my_tasks}:Doubling", task_kwargs={"max_number": 3})
    assert config.task == "my_tasks:Doubling"
    with pytest.raises(ValueError, match=r"task 'my_tasks:Nope': cannot import it \(AttributeError"):
        TrainConfig(model="m", task="my_tasks:Nope", task_kwargs={})
    with pytest.raises(ValueError, match=r"setup_modules: cannot import 'no_such_module'"):
        TrainConfig(model="m", setup_modules=["no_such_module"])


class PartialOnly:
    """Every answer earns partial credit and none is correct: accuracy must be 0, the reward 0.5."""

    name = "partial_only"

    def __init__(self, **_):
        self.inner = tasks.get("arithmetic", digits=1)

    def sample(self, rng):
        return self.inner.sample(rng)

    def verify(self, problem, completion):
        return 0.5


def test_held_out_accuracy_is_exact_correctness_not_positive_reward(zoo, tmp_path):
    tasks.register("partial_only", PartialOnly)
    result = train(TrainConfig(**{**RUN, "model": str(zoo("tiny-qwen3")), "out_dir": str(tmp_path / "out"),
                                  "task": "partial_only", "task_kwargs": {}}))
    evaluated = [r for r in result.rows if "eval_accuracy" in r]
    assert [r["step"] for r in evaluated] == [0, 1]
    assert all(r["eval_accuracy"] == 0.0 and r["eval_reward"] == 0.5 for r in evaluated)
