"""minirl.tasks: deterministic generation, disjoint held-out split, verifiers, exported data."""

from __future__ import annotations

from pathlib import Path

import pytest

from minirl import tasks

DATASETS = Path(__file__).resolve().parents[3] / "datasets"


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "sorting", "longtail_sorting"])
def test_generation_is_deterministic_and_split_is_disjoint(name):
    task = tasks.get(name)
    train, held_out = tasks.splits(task, 200, 50, seed=3)
    assert (train, held_out) == tasks.splits(task, 200, 50, seed=3)
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert tasks.splits(task, 20, 50, seed=3)[1] == held_out  # eval split independent of n_train
    assert all(task.verify(p, f" {p.answer}\nQ: junk") for p in train + held_out)


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "sorting"])
def test_exported_eval_files_match_generation(name):
    _, held_out = tasks.splits(tasks.get(name), 1, 100, seed=0)
    assert tasks.load(DATASETS / f"{name}_eval.jsonl") == held_out


def test_verifiers_reject_wrong_and_unsafe_answers():
    arith = tasks.Problem("Q: 3+4= A:", "7", {"value": 7})
    assert not tasks.get("arithmetic").verify(arith, " 8")
    assert not tasks.get("arithmetic").verify(arith, " seven")
    cd = tasks.Problem("Q: 3 5 7 to 22 A:", "3*5+7", {"numbers": [3, 5, 7], "target": 22})
    countdown = tasks.get("countdown")
    assert countdown.verify(cd, " 7+5*3")
    assert not countdown.verify(cd, " 22")  # numbers not used
    assert not countdown.verify(cd, " 3*5+7+0")  # extra number
    assert not countdown.verify(cd, " __import__('os')")
    assert not countdown.verify(cd, " 9**9**9")
    srt = tasks.Problem("Q: sort 5 2 9 A:", "2 5 9", {"sorted": [2, 5, 9]})
    assert tasks.get("sorting").verify(srt, " 2 5 9")
    assert not tasks.get("sorting").verify(srt, " 2 9 5")


def test_bad_task_inputs():
    with pytest.raises(ValueError, match="did you mean 'sorting'"):
        tasks.get("sortin")
    with pytest.raises(ValueError, match="empty"):
        tasks.splits(tasks.get("arithmetic"), 0, 4, seed=0)
    with pytest.raises(ValueError, match="distinct problems"):
        tasks.splits(tasks.get("arithmetic", digits=1), 1000, 10, seed=0)


def test_longtail_sorting_lengths_are_geometric_and_capped():
    """Most lists short, a few long, none past max_length: the long tail async/C3PO++ runs need."""
    import random

    task = tasks.get("longtail_sorting", max_length=12, p=0.35)
    rng = random.Random(0)
    lengths = [len(task.sample(rng).meta["sorted"]) for _ in range(4000)]
    assert min(lengths) == 1 and max(lengths) == 12
    share_one = lengths.count(1) / len(lengths)
    assert abs(share_one - 0.35) < 0.03  # P(n = 1) = p
    assert lengths.count(12) / len(lengths) < 0.02  # the cut-off tail
    with pytest.raises(ValueError, match="0 < p <= 1"):
        tasks.get("longtail_sorting", p=0.0)
