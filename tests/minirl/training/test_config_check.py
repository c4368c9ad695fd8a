"""Every TrainConfig value is checked at load, from the dataclass annotations and what each field declares:
each hostile value of the round-2 pass is refused naming its key, its value and what is valid."""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field

import pytest

from labs import cli
from minirl.training import config_check, config_file
from minirl.training.train_config import TrainConfig


@pytest.mark.parametrize("values, message", [
    # types (YAML slips): each named with the key, the value and the expected type
    (dict(steps="ten"), "steps='ten' (str): expected a whole numbe"),
    (dict(group_size="eight"), "group_size='eight' (str): expected a whole numbe"),
    (dict(prompts_per_step=2.5), "prompts_per_step=2.5 (float): expected a whole numbe"),
    (dict(task=None), "task=null: expected a string"),
    (dict(model=None), "model=null: expected a string"),
    (dict(progress="no"), "progress='no' (str): expected true or false"),
    (dict(betas=[0.9]), "betas=[0.9] (list): expected a list of 2 values, each a numbe"),
    (dict(task_kwargs="digits=2"), "task_kwargs='digits=2' (str): expected a mapping"),
    # ranges: key, value, the valid range and why
    (dict(n_eval=-5), "n_eval=-5: must be >= 0"),
    (dict(steps=-3), "steps=-3: must be >= 1"),
    (dict(temperature=0), "temperature=0.0: must be >= 0.01 and finite (0 is greedy decoding"),
    (dict(kl_coef=-1), "kl_coef=-1.0: must be >= 0 and finite"),
    (dict(eps_low=1.5), "eps_low=1.5: must be >= 0 and < 1"),
    (dict(sft_steps=-5), "sft_steps=-5: must be >= 0"),
    (dict(grad_clip=math.nan), "grad_clip=.nan: must be > 0 and finite"),
    (dict(grad_clip=-1), "grad_clip=-1.0: must be > 0 and finite"),
    (dict(lr=math.inf), "lr=inf: must be > 0 and finite"),
    (dict(checkpoint_every=-1), "checkpoint_every=-1: must be >= 0 (0 = never write a checkpoint"),
    (dict(betas=[0.9, 1.5]), "betas=[0.9, 1.5]: each value must be >= 0 and < 1"),
    (dict(reward_timeout_s=math.nan), "reward_timeout_s=.nan: must be > 0"),
    # the task's own options, named as task_kwargs
    (dict(task_kwargs={"digits": -1}), "task_kwargs={'digits': -1} do not make a valid 'arithmetic' task"),
    (dict(task="countdown"), "task_kwargs={'digits': 1}: task 'countdown' does not take these options"),
])
def test_bad_value_is_refused_naming_key_value_and_range(values, message):
    with pytest.raises(ValueError) as err:
        TrainConfig.from_dict(values)
    assert message in str(err.value)
    assert f"set {next(iter(values))} to" in str(err.value) or "fix task_kwargs" in str(err.value)


def test_lossless_conversions_only():
    """An int for a float, a list for a tuple, a Path for a string, YAML 1.1's string '1e-3' for a
    float: converted."""
    from pathlib import Path

    c = TrainConfig(lr="1e-3", betas=[0.8, 0.9], temperature=1, out_dir=Path("runs") / "x")
    assert (c.lr, c.betas, c.temperature, c.out_dir) == (1e-3, (0.8, 0.9), 1.0, "runs/x")
    assert type(c.temperature) is float and TrainConfig.from_dict(c.to_dict()) == c


def test_a_new_field_is_checked_with_no_new_code():
    """Any dataclass's annotations drive the check: the types a future field may have."""

    @dataclass
    class Future:
        count: int = 1
        ratio: float | None = None
        names: list[str] = field(default_factory=list)
        pair: tuple[int, int] = (1, 2)
        table: dict[str, int] = field(default_factory=dict)

    config_check.check(Future(ratio=None, names=["a"], pair=[3, 4]))
    for bad, message in [(dict(count=True), "count=True"), (dict(ratio=[1]), "expected a number or null"),
                         (dict(names=["a", 1]), "names="), (dict(pair=(1, 2, 3)), "a list of 2 values"),
                         (dict(table={"a": "b"}), "table="),
                         (dict(ratio=math.nan), "ratio=.nan: NaN is not a setting; set ratio to a number")]:
        with pytest.raises(ValueError, match=message):
            config_check.check(Future(**bad))


def test_a_field_declares_its_range_values_and_non_empty_beside_itself():
    """``ranged``, ``one_of`` and ``non_empty`` put what is valid on the field (dataclass metadata)."""

    @dataclass
    class Future:
        count: int = config_check.ranged(1, 1, why="one at least")
        kind: str = config_check.one_of("a", ("a", "b"))
        path: str = config_check.non_empty("x", "it names a file", "a file name")

    config_check.check(Future())
    for bad, message in [(dict(count=0), "count=0: must be >= 1 (one at least); set count to a value >= 1"),
                         (dict(kind="c"), "kind='c'; valid: a, b; set kind to one of them"),
                         (dict(path=" "), "path=' ': must not be empty (it names a file); set path to a file name")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            config_check.check(Future(**bad))


def test_cli_set_names_the_key(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(f"model: {tmp_path}\nout_dir: {tmp_path / 'run'}\n")
    for setting, message in [("steps=ten", "steps='ten' (str): expected a whole number"),
                             ("betas=[0.9]", "betas=[0.9] (list)"), ("lr=[1", "--set 'lr=[1': not valid YAML")]:
        assert cli.main(["train", "--config", str(path), "--set", setting]) == 2
        assert message in capsys.readouterr().err
    path.write_text("model: [unclosed\n")
    assert cli.main(["train", "--config", str(path)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.parametrize("case, values, message", [
    # round 3 (issue 38): sizes that could only hang or exhaust memory, each with its reason
    ("C02", dict(n_train=10**9), "n_train=1000000000: must be >= 1 and <= 1000000 (the problems are drawn up front"),
    ("C03", dict(prompts_per_step=10**8), "prompts_per_step=100000000: must be >= 1 and <= 65536"),
    ("C04", dict(group_size=10**8), "group_size=100000000: must be >= 2 and <= 4096"),
    ("C05", dict(max_new_tokens=10**30), "max_new_tokens=1000000000000000000000000000000: must be >= 1 and <= 1048576"),
    ("C07", dict(epochs=10**9), "epochs=1000000000: must be >= 1 and <= 1000 (passes over each step's batch"),
    ("C09", dict(temperature=1e-300), "temperature=1e-300: must be >= 0.01 and finite"),
    ("C11b", dict(task="python_tool", tool_timeout_s=math.inf), "tool_timeout_s=inf: must be > 0 and <= 3600 (the "
                                                                  "sandbox's limit for one tool call"),
    ("C12b", dict(task="python_tool", tool_timeout_s=1e9), "tool_timeout_s=1000000000.0: must be > 0 and <= 3600"),
    ("C39", dict(out_dir=""), "out_dir='': must not be empty ('' would write the run's files into the current "
                              "directory)"),
    ("batch", dict(prompts_per_step=65536, group_size=64), "prompts_per_step * group_size = 4194304: one step's "
                                                           "rollouts, generated and held as one batch, must be <= "),
])
def test_sizes_that_only_hang_are_refused_with_a_reason(case, values, message):
    with pytest.raises(ValueError) as err:
        TrainConfig.from_dict(values)
    assert message in str(err.value)


def test_an_echoed_value_is_capped():
    """Before (C19): the repr of a huge value in the type error took minutes and megabytes."""
    with pytest.raises(ValueError) as err:
        TrainConfig.from_dict(dict(betas=[0.5] * 100_000, task_kwargs={"digits": "x" * 10_000}))
    assert "betas=[0.5, 0.5" in str(err.value) and len(str(err.value)) < 400
    with pytest.raises(ValueError) as err:
        TrainConfig.from_dict({"k" * 10_000: 1})
    assert "unknown config key 'kkk" in str(err.value) and len(str(err.value)) < 3000


LAUGHS = "task_kwargs:\n" + "".join(
    f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9))


@pytest.mark.parametrize("case, text, message", [
    ("C15", "task_kwargs: " + "[" * 20_000 + "]" * 20_000, "line 1: nested too deep (more than 32 levels"),
    ("C16", "task_kwargs: " + "{a: " * 20_000 + "1" + "}" * 20_000, "line 1: nested too deep (more than 32 levels"),
    ("C18", LAUGHS, "line 2: YAML anchors and aliases (& and *) are not accepted"),
    ("C19", "x: &a8 [1, 2]\nbetas: [*a8, *a8]\n", "line 1: YAML anchors and aliases (& and *) are not accepted"),
    ("C27", "steps: 2\nsteps: 100000\n", "line 2: key 'steps' is given twice (first on line 1); keep one"),
    ("C27b", "task_kwargs: {digits: 1, digits: 2}\n", "line 1: key 'digits' is given twice (first on line 1)"),
])
def test_a_config_file_is_read_safely_and_refusals_name_the_file(tmp_path, case, text, message):
    """Before: a RecursionError, gigabytes of memory, a 254 MB message, or (C27) the last value won."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    for read in (config_file.read_config_file, TrainConfig.from_yaml):  # one loader behind both
        with pytest.raises(ValueError) as err:
            read(path)
        assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)[:300]


def test_the_cli_reads_through_the_same_loader(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(f"out_dir: {tmp_path / 'run'}\nsteps: 2\nsteps: 3\n")
    assert cli.main(["train", "--config", str(path)]) == 2
    assert f"{path}: line 3: key 'steps' is given twice" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    path.write_text(f"out_dir: {tmp_path / 'run'}\nsteps: 2\n")
    assert cli.main(["train", "--config", str(path), "--set", "betas=&a [1, 2]"]) == 2
    assert "--set 'betas=&a [1, 2]': line 1: YAML anchors and aliases" in capsys.readouterr().err


def test_a_config_that_is_not_a_small_regular_file_is_refused_by_name(tmp_path):
    """Before (C35): ``--config /dev/zero`` read until memory ran out, without naming the file."""
    fifo, dev, big = tmp_path / "fifo", tmp_path / "zero", tmp_path / "big.yaml"
    os.mkfifo(fifo)  # opening it would block: refused from its stat alone
    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # a /dev/zero of our own
    big.write_text("# padding\n" * (config_file.MAX_BYTES // 10 + 1))
    for path, message in [(fifo, "not a regular file"), (dev, "not a regular file"), (tmp_path, "not a regular file"),
                          (big, "larger than 1 MiB"), (tmp_path / "none.yaml", "cannot read it (No such file")]:
        with pytest.raises(ValueError, match=f"^{path}: {re.escape(message)}"):
            config_file.read_config_file(path)


def test_a_plain_config_still_reads():
    text = "steps: 3\nbetas: [0.9, 0.99]\ntask_kwargs: {digits: 2}\nname: &not_an_anchor_in_a_string\n"
    with pytest.raises(ValueError, match="anchors"):  # an anchor with no alias is refused too: none is needed
        config_file.parse_yaml(text, "x")
    assert config_file.parse_yaml("steps: 3\nbetas: [0.9, 0.99]\ntask_kwargs: {digits: 2}\nnote: 'a & b * c'\n",
                                  "x") == {"steps": 3, "betas": [0.9, 0.99], "task_kwargs": {"digits": 2},
                                           "note": "a & b * c"}
