"""Every TrainConfig value is checked at load, from the dataclass annotations and one range table:
each hostile value of the round-2 pass is refused naming its key, its value and what is valid."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from labs import cli
from minirl.training import config_check
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
    (dict(temperature=0), "temperature=0.0: must be > 0 and finite (0 is greedy decoding"),
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
