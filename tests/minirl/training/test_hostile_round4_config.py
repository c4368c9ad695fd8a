"""Hostile inputs, round 4 (issue 48): extension points (a user's task or setup module, the registries)
and the config reader. Each test is named by its case id; every case is refused before a model loads,
by a message naming the key, the module or the line, and what to do."""

from __future__ import annotations

import sys

import pytest

from labs import cli
from minirl import tasks
from minirl.algorithms import corrections
from minirl.tasks.arithmetic import Arithmetic
from minirl.training.config_file import read_config_file
from minirl.training.train_config import TrainConfig

MODULES = {
    "exiting_mod": "import sys\nsys.exit(0)\n",
    "raising_mod": "raise RuntimeError('boom at import')\n",
    "syntax_mod": "def (:\n",
    "arithmetic_again": (
        "from minirl import tasks\n\n\nclass AlwaysRight:\n    name = 'arithmetic'\n\n"
        "    def sample(self, rng):\n        return tasks.Problem('Q: 1+1= A:', '2', {'value': 2})\n\n"
        "    def verify(self, problem, completion):\n        return 1.0\n\n\n"
        "tasks.register('arithmetic', AlwaysRight)\n"),
    "needs_field_mod": (
        "from minirl.algorithms.corrections import register_correction\n\n\n"
        "@register_correction('needs_field', cap='no_such_field')\n"
        "def needs_field(logp_train, logp_infer, mask, cap=1.0):\n    return logp_train, mask, {}\n"),
}


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """``MODULES`` written to a folder on ``sys.path``; the task and correction tables and
    ``sys.modules`` as they were after the test (a module that imported registered into them)."""
    folder = tmp_path / "user"
    folder.mkdir()
    for name, text in MODULES.items():
        (folder / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))
    monkeypatch.setattr(corrections.CORRECTIONS, "entries", dict(corrections.CORRECTIONS.entries))
    yield folder
    for name in MODULES:
        sys.modules.pop(name, None)


def refused(message: str, **values) -> None:
    with pytest.raises(ValueError) as e:
        TrainConfig(model="m", **values)
    assert message in str(e.value), str(e.value)


def train_cli(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    code = cli.main(["train", "--config", str(path), "--set", f"out_dir={tmp_path / 'out'}"])
    return code, capsys.readouterr().err


EXITS = "called sys.exit(0); a module a config names must only define (and register) things when imported"


def test_X14(user_modules, tmp_path, capsys):  # a setup module calling sys.exit(0) no longer reads as success
    code, err = train_cli(tmp_path, capsys, "model: m\nsetup_modules: [exiting_mod]\n")
    assert code == 2 and f"mlab train: error: setup_modules: importing 'exiting_mod' {EXITS}" in err, err
    assert not (tmp_path / "out").exists()


def test_X04(user_modules, tmp_path, capsys):
    code, err = train_cli(tmp_path, capsys, "model: m\ntask: exiting_mod:Task\n")
    assert code == 2 and f"mlab train: error: task 'exiting_mod:Task': importing 'exiting_mod' {EXITS}" in err, err


def test_X18(user_modules):  # the built-in task is not replaced, and the refusal names both definitions
    refused("setup_modules: importing 'arithmetic_again' raised ValueError: task 'arithmetic' is already registered "
            "(minirl.tasks.arithmetic.Arithmetic); register arithmetic_again.AlwaysRight under another name",
            setup_modules=["arithmetic_again"])
    assert tasks.factory("arithmetic") is Arithmetic


def test_X18_only_the_same_definition_imported_anew_registers_its_name_again(monkeypatch):
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))

    class Twice(Arithmetic):
        pass

    tasks.register("twice", Twice)
    anew = type("Twice", (Arithmetic,), {"__qualname__": Twice.__qualname__, "__module__": Twice.__module__})
    tasks.register("twice", anew)  # what a fresh import of the defining module registers
    assert tasks.factory("twice") is anew
    with pytest.raises(ValueError, match="task 'twice' is already registered"):
        tasks.register("twice", Arithmetic)


def test_X20(user_modules):  # a correction reading a field TrainConfig lacks: refused when the config is built
    refused("correction 'needs_field' (needs_field_mod.needs_field) reads TrainConfig field no_such_field, which "
            "TrainConfig does not have", setup_modules=["needs_field_mod"], correction="needs_field")
    TrainConfig(model="m", setup_modules=["needs_field_mod"])  # registered, not chosen: nothing reads it


def test_X26():
    refused("task_kwargs.digits=True (bool): expected a whole number", task_kwargs={"digits": True})


def test_X02(user_modules):
    refused("task 'raising_mod:Task': importing 'raising_mod' raised RuntimeError: boom at import",
            task="raising_mod:Task")


def test_X12(user_modules):
    refused("setup_modules: importing 'raising_mod' raised RuntimeError: boom at import", setup_modules=["raising_mod"])


def test_X03(user_modules):
    refused(f"task 'syntax_mod:Task': 'syntax_mod' has a syntax error (invalid syntax, {user_modules}/syntax_mod.py, "
            f"line 1)", task="syntax_mod:Task")


def test_X13(user_modules):
    refused("setup_modules: 'syntax_mod' has a syntax error (invalid syntax", setup_modules=["syntax_mod"])


def test_X15():
    refused("setup_modules: '..x' is a relative module name; give an absolute one", setup_modules=["..x"])


def test_X16():
    refused("setup_modules: '' is not a module name", setup_modules=[""])


@pytest.mark.parametrize("case, path, what", [("X05", "builtins:dict", "dict is a class"),
                                              ("X06", "builtins:len", "len is a builtin_function_or_method"),
                                              ("X08", "minirl.tasks:Problem", "Problem is a class")])
def test_X05_X06_X08(case, path, what):  # not a task, said as such, not blamed on task_kwargs
    refused(f"task {path!r}: not a task ({what} without sample and verify)", task=path)


def test_X07():
    refused("task '..evil:Task': '..evil' is a relative module name", task="..evil:Task")


def test_MN09():
    refused("monitor_sites=',,,': must not be empty (the monitor would watch nothing)",
            monitor_every=1, monitor_sites=",,,")


def test_CF22(tmp_path, capsys):  # required of the merged config: --set model=... (as configs/*.yaml say) counts
    code, err = train_cli(tmp_path, capsys, "# only a comment\n")
    assert code == 2 and "run.yaml: model is required" in err and "--set model=PATH" in err, err


def config_refused(tmp_path, text: str | bytes, message: str) -> None:
    """``text`` as a config file is refused with ``message`` (``<file>``: the file's path)."""
    path = tmp_path / "run.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as e:
        TrainConfig.from_dict(read_config_file(path))
    assert message.replace("<file>", str(path)) in str(e.value), str(e.value)


def test_CF29(tmp_path):
    config_refused(tmp_path, "steps: 2\nseed: 017\n",
                   "<file>: line 2: seed=017 has a leading zero, which YAML reads as octal (15); write it without the zero")


def test_CF02(tmp_path):
    config_refused(tmp_path, "steps: 1" + "0" * 400 + "\n",
                   "0000: must be >= 1 and <= 9223372036854775807; set steps to a value")


MERGE = "<file>: line 1: merge keys (<<) are not accepted in a config"


@pytest.mark.parametrize("case, text", [("CF15", "<<: {steps: 100000}\nsteps: 2\n"),
                                        ("CF16", "<<: {steps: 1}\nsteps: 100000\n"),
                                        ("CF16b", "<<: [{lr: 1.0e-3}, {lr: 0.5}]\n")])
def test_CF15_CF16_CF16b(tmp_path, case, text):
    config_refused(tmp_path, text, MERGE)


def test_CF20b(tmp_path):
    config_refused(tmp_path, b"steps: 2\nlr: 1\x00\n", "<file>: line 2: a control character (0x0000) YAML does not accept")


def test_CF32(tmp_path):  # 1 and true are two keys, each unknown: not "given twice"
    config_refused(tmp_path, "steps: 2\n1: a\ntrue: b\n", "unknown config key 1:")
    config_refused(tmp_path, "steps: 2\ntrue: b\n", "unknown config key True:")
