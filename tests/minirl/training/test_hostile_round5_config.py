"""Hostile inputs, round 5 (issue 65), the trainer's config: micro-batches, the bf16 trainer,
``shared_prefix``, ``engine: sglang`` specs and chat_arithmetic's options. Every refusal comes when
the config is built (or, for what only the task can tell, before the model loads: the model path
here does not exist, so a later refusal would name it instead), naming the key and the fix; the
accepted cases are accepted. Named by the round-5 case id (TC, TR, CF)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from labs import cli
from minirl.driver import train
from minirl.training.train_config import TrainConfig
from tests.minirl.training.lifecycle_checks import lifecycle_config

NO_MODEL = "/nonexistent/model"
CHAT = {"task": "chat_arithmetic"}


def _refused(match: str, **values) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**values)


def _cli(tmp_path, capsys, values: dict) -> str:
    """``mlab train`` of ``values`` (a config file): refused with exit 2; its one-line message."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": NO_MODEL, "out_dir": str(tmp_path / "out"), **values}))
    assert cli.main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert NO_MODEL not in err and not (tmp_path / "out").exists(), err  # before the model, nothing written
    return err


@pytest.mark.parametrize("case, value, match", [
    ("TC01", -1, r"micro_batch_size=-1: must be >= 0 .*set micro_batch_size to a value >= 0"),
    ("TC05", 2.5, r"micro_batch_size=2.5 \(float\): expected a whole number"),
    ("TC06", True, r"micro_batch_size=True \(bool\): expected a whole number"),
    ("TC07", "4", r"micro_batch_size='4' \(str\): expected a whole number"),
    ("TC08", float("nan"), r"micro_batch_size=nan \(float\): expected a whole number"),
])
def test_TC01_TC05_TC08_a_bad_micro_batch_size_is_refused(case, value, match):
    _refused(match, micro_batch_size=value)


@pytest.mark.parametrize("case, value", [("TC02", 0), ("TC03", 10**9), ("TC04", 3)])
def test_TC02_TC04_zero_large_and_non_dividing_micro_batches_are_accepted(case, value):
    assert TrainConfig(micro_batch_size=value, prompts_per_step=4, group_size=4).micro_batch_size == value


def test_TC09_micro_batches_with_espo_are_refused():
    _refused(r"micro_batch_size=4 with loss: espo: .*set micro_batch_size: 0, or use loss: ppo or gspo",
             micro_batch_size=4, loss="espo")


TRAINER_DTYPES = next(f for f in dataclasses.fields(TrainConfig) if f.name == "trainer_dtype").metadata["one_of"]
"""The trainer dtypes this version takes (float32, bfloat16: the case list's; float16 where added)."""


@pytest.mark.parametrize("case, value", [("TC10", "bf16"), ("TC11", "float16"), ("TC12", "BFLOAT16"),
                                         ("TC13", "float64"), ("TC14", None)])
def test_TC10_TC14_a_trainer_dtype_outside_the_valid_ones_is_refused_listing_them(case, value):
    if value in TRAINER_DTYPES:  # TC11: refused while the trainer took float32 and bfloat16 only
        assert TrainConfig(trainer_dtype=value).trainer_dtype == value
        return
    listed = ", ".join(TRAINER_DTYPES)
    match = ("trainer_dtype=null: expected a string" if value is None else
             rf"trainer_dtype='{value}'; valid: {listed}; set trainer_dtype to one of them")
    assert {"float32", "bfloat16"} <= set(TRAINER_DTYPES)
    _refused(match, trainer_dtype=value)


@pytest.mark.parametrize("case, lr", [("TC15", float("nan")), ("TC16", float("inf")), ("TC18", 0.0)])
def test_TC15_TC16_TC18_a_bf16_trainers_lr_must_be_positive_and_finite(case, lr):
    _refused(r"lr=.*: must be > 0 and finite; set lr to a value > 0 and finite", trainer_dtype="bfloat16", lr=lr)


def test_TC17_a_tiny_lr_is_accepted():
    assert TrainConfig(trainer_dtype="bfloat16", lr=1e-300).lr == 1e-300


@pytest.mark.parametrize("case, value", [("TC19", "flash_attention_2"), ("TC20", "Eager"), ("TC21", ""),
                                         ("TC22", "flex_attention")])
def test_TC19_TC22_a_trainer_attention_outside_the_valid_ones_is_refused_listing_them(case, value):
    _refused(rf"trainer_attention='{value}'; valid: auto, sdpa, eager; set trainer_attention to one of them",
             trainer_attention=value)


@pytest.mark.parametrize("case, value", [("TC23", "yes"), ("TC24", 1), ("TC25", None)])
def test_TC23_TC25_shared_prefix_is_true_or_false(case, value):
    _refused(r"shared_prefix=.*: expected true or false; set shared_prefix to true or false", shared_prefix=value)


@pytest.mark.parametrize("case, replay", [("TC26", "r2"), ("TC27", "r3")])
def test_TC26_TC27_shared_prefix_with_router_replay_is_refused(case, replay):
    _refused(r"shared_prefix with router_replay does not combine: .*set shared_prefix: false",
             shared_prefix=True, router_replay=replay)


@pytest.mark.parametrize("case, values, match", [
    ("TC29", {"engine": "sglang:bfloat16", "engine_dtype": "float32"},
     r"engine spec 'sglang:bfloat16' names dtype bfloat16 but the dtype given is float32"),
    ("TC30", {"engine": "sglang:float64"}, r"'float64' is not a sglang dtype \(float32, bfloat16, float16\)"),
    ("TC31", {"engine": "sglang:bf16"}, r"'bf16' is not a sglang dtype \(float32, bfloat16, float16\)"),
    ("TC33", {"engine": "sglang,max_total_tokens=0"}, r"sglang option max_total_tokens=0 is a size and must be at "
                                                      r"least 1; give a positive max_total_tokens"),
    ("TC34", {"engine": "sglang,max_total_tokens=-5"}, r"max_total_tokens=-5 is a size and must be at least 1"),
    ("TC35", {"engine": "sglang,max_total_tokens=abc"}, r"sglang option max_total_tokens='abc' is not a int"),
    ("TC36", {"engine": "sglang,max_total_tokens=1e9"}, r"sglang option max_total_tokens='1e9' is not a int"),
    ("TC37", {"engine": "sglang,max_total_tokens=10**20"}, r"max_total_tokens='10\*\*20' is not a int"),
    ("TC38", {"engine": "sglang,foo=1"}, r"unknown sglang option 'foo'; valid options: max_total_tokens=<int>"),
    ("TC39", {"engine": "SGLANG"}, r"unknown engine 'SGLANG'; engines here: minirl, vllm, sglang"),
    ("TC40", {"engine": "sglang:float32,dtype=bfloat16"}, r"names the dtype twice \(float32 and dtype=bfloat16\)"),
    ("TC41", {"engine": "sglang", "engine_dtype": "float64"}, r"'float64' is not a sglang dtype"),
    ("TC42", {"engine": "sglang:float32", "engine_dtype": "bfloat16"},
     r"names dtype float32 but the dtype given is bfloat16 \(--dtype / engine_dtype\)"),
])
def test_TC29_TC42_bad_sglang_specs_are_refused_naming_the_token(case, values, match):
    _refused(rf"engine: .*{match}", **values)


@pytest.mark.parametrize("case, engine", [("TC28", "sglang"), ("TC32", "sglang:"), ("TC43", "sglang")])
def test_TC28_TC32_TC43_sound_sglang_specs_are_accepted(case, engine):
    """``sglang:`` has an empty head, read as none (the default dtype); the monitor reads SGLang (TC43)."""
    assert TrainConfig(engine=engine, monitor_every=1 if case == "TC43" else 0).engine == engine


def test_TR05_a_negative_kv_pool_is_refused_before_the_model_loads(tmp_path, capsys):
    err = _cli(tmp_path, capsys, {"engine": "sglang:float32,max_total_tokens=-5"})
    assert "sglang option max_total_tokens=-5 is a size and must be at least 1" in err


@pytest.mark.parametrize("case, options, match", [
    ("TC44", {"min_words": -1}, r"chat_arithmetic min_words=-1: must be an int in \[0, 200\]"),
    ("TC45", {"min_words": 201}, r"chat_arithmetic min_words=201: must be an int in \[0, 200\]"),
    ("TC46", {"min_words": 2.0}, r"task_kwargs.min_words=2.0 \(float\): expected a whole number"),
    ("TC47", {"min_words": True}, r"task_kwargs.min_words=True \(bool\): expected a whole number"),
    ("TC48", {"digits": 0}, r"chat_arithmetic digits=0: must be an int in \[1, 9\]"),
    ("TC49", {"digits": 10}, r"chat_arithmetic digits=10: must be an int in \[1, 9\]"),
    ("TC50", {"second_digits": None}, r"task_kwargs.second_digits=null: expected a whole number"),
    ("TC51", {"name": "x"}, r"task_kwargs.name='x': `name` is not a task option \(the task is named by the `task` "
                            r"key, here 'chat_arithmetic'\); remove it from task_kwargs"),
])
def test_TC44_TC51_bad_chat_arithmetic_options_are_refused_by_name(case, options, match):
    _refused(match, **CHAT, task_kwargs=options)


@pytest.mark.parametrize("case, sizes", [("TC52", {"n_train": 1000}), ("TC53", {"n_train": 150, "n_eval": 32})])
def test_TC52_TC53_more_problems_than_the_task_has_are_refused_before_the_model(case, sizes, tmp_path):
    """1-digit ± 1-digit: 155 distinct problems (CA13)."""
    config = TrainConfig(**CHAT, task_kwargs={"digits": 1, "second_digits": 1}, model=NO_MODEL,
                         out_dir=str(tmp_path / "out"), **sizes)
    total = sizes["n_train"] + sizes.get("n_eval", config.n_eval)
    with pytest.raises(ValueError, match=rf"task 'chat_arithmetic' has fewer than {total} distinct problems; lower "
                                         rf"n_train/n_eval"):
        train(config)


def test_TC54_bf16_micro_batches_shared_prefix_and_eager_are_accepted():
    config = TrainConfig(trainer_dtype="bfloat16", micro_batch_size=1, shared_prefix=True, trainer_attention="eager")
    assert (config.trainer_dtype, config.micro_batch_size, config.shared_prefix) == ("bfloat16", 1, True)


def test_CF22_a_config_of_only_a_comment_is_refused_model_is_required(tmp_path, capsys, monkeypatch):
    """At the CLI (round 4's test_CF22 too) and through ``minirl.train(path)``: never a run with
    ``model: ''`` (the default out_dir is relative: here, under tmp_path)."""
    monkeypatch.chdir(tmp_path)
    comment = tmp_path / "comment.yaml"
    comment.write_text("# only a comment\n")
    assert cli.main(["train", "--config", str(comment)]) == 2
    assert "comment.yaml: model is required" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model is not set: set model to an HF checkpoint directory"):
        train(comment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comment.yaml"]  # no run directory was made


def test_TR01_a_bf16_shared_prefix_eager_run_in_micro_batches_of_3_trains(zoo, tmp_path):
    """TC54's combination run for 2 steps with micro-batches that do not divide the 8 rows."""
    config = lifecycle_config(str(zoo("tiny-llama")), tmp_path / "run", "sync", steps=2, eval_every=0,
                              trainer_dtype="bfloat16", micro_batch_size=3, shared_prefix=True,
                              trainer_attention="eager")
    rows = [r for r in train(config).rows if "loss" in r]
    assert [r["step"] for r in rows] == [0, 1] and all(math.isfinite(r["loss"]) for r in rows)
