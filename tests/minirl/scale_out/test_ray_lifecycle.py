"""``mode: ray`` is a first-class run on one local cluster: the lifecycle every mode shares (artefacts,
evaluation schedule, resume rules; ``tests/minirl/training/lifecycle_checks.py``), and a researcher's
task (docs/rl.md's example) from ``mlab train``, imported by the Ray workers too."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import yaml

pytest.importorskip("ray")

from labs import cli  # noqa: E402
from minirl.training import run_log  # noqa: E402
from tests.minirl.tasks.example_task import write_example  # noqa: E402
from tests.minirl.training.lifecycle_checks import check_lifecycle  # noqa: E402


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory):
    """docs/rl.md's ``my_tasks.py`` on PYTHONPATH before the cluster starts, so its workers import it."""
    folder = tmp_path_factory.mktemp("example")
    write_example(folder)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *([before] if before else [])])
    yield folder
    if before is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture(scope="module", autouse=True)
def cluster(example_dir, ray_cluster):  # in this order: the workers inherit PYTHONPATH
    yield


@pytest.mark.slow  # ~36 s alone, ~125 s inside `make test` (Ray's actors contend with the other worker); the
# lifecycle is one class for every mode (minirl.training.lifecycle), checked per mode in `make test` for sync
# and async, and ray mode's run, resume and numbers by the example task and the killed-actor test
def test_ray_mode_is_a_first_class_run(zoo, tmp_path):
    check_lifecycle(str(zoo("tiny-qwen3")), tmp_path / "run", "ray")


def test_example_task_runs_from_mlab_train_in_ray_mode_with_the_monitor(zoo, tmp_path, example_dir, monkeypatch,
                                                                         capsys):
    """The researcher's task from ``mlab train``, and the mismatch monitor in ray mode: the rollout
    actor reads its own engine against the trainer actor's model, on the published weights. With
    either side one update (lr 1e-2) behind the other a reading is ~1 (measured, the trainer side
    left on its first weights); every reading is at fp32 noise."""
    monkeypatch.syspath_prepend(str(example_dir))  # the driver imports it as the workers do
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(dict(
        model=str(zoo("tiny-qwen3")), mode="ray", task="my_tasks:Doubling", task_kwargs={"max_number": 50},
        sft_steps=0, prompts_per_step=2, group_size=4, max_new_tokens=6, steps=1, minibatches=1, n_train=8, n_eval=4,
        eval_every=1, checkpoint_every=0, progress=False, rollout_actors=1, cpus_per_actor=0.5, lr=1e-2, seed=1,
        engine="minirl:aligned", engine_dtype="float32", monitor_every=1, monitor_tokens=32,
        out_dir=str(tmp_path / "out"))))
    assert cli.main(["train", "--config", str(path)]) == 0, capsys.readouterr().err
    log = run_log.load(tmp_path / "out" / "metrics.nc")
    assert log["step"].values.tolist() == [0, 1]
    assert not math.isnan(log["reward"].values[0])  # the reward actor scored with the imported task
    for accuracy, reward in zip(log["eval_accuracy"].values, log["eval_reward"].values):
        assert 0 <= accuracy <= reward <= 1
    # seed 1: step 0's groups have mixed rewards (with seed 0 every sample scores 0.2 and nothing moves)
    assert log["grad_norm"].values[0] > 0 and log["opt_skipped"].values[0] == 0, \
        "no update at step 0 with these draws: pick a seed whose first step has mixed rewards"  # a stale side shows
    assert log["monitor_step"].values.tolist() == [0, 1] and log.sizes["site"] == 12  # 4 layers x 3 dense sites
    assert np.nanmax(log["monitor_rel_l2"].values) < 1e-5
    assert log["monitor_first_divergence"].values.tolist() == ["", ""]
    assert (tmp_path / "out" / "monitor.png").stat().st_size > 10_000
