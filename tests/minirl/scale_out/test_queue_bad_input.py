"""Bad arguments to the TransferQueue: each refused where it enters, never a hang or a silent loss.

Before: ``admit(0)``/``admit(-3)`` and ``get(timeout=nan)`` blocked forever, a misspelt column
returned ``[]`` after the timeout, a ``give_back`` after the last read lost the sample without
a count, and ``QueueConfig(columns="prompt")`` / ``timeout_s=nan`` were accepted.
"""

from __future__ import annotations

import math

import pytest

from minirl.scale_out.transfer_queue import LocalTransferQueue, QueueConfig

CFG = QueueConfig(columns=("prompt", "out"), consumers=("work", "train"), capacity=4, timeout_s=60)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("n", [0, -3, 1.5, True])
def test_admitting_no_sample_or_a_non_integer_count_is_refused(n):
    q = LocalTransferQueue(CFG)
    with pytest.raises(ValueError, match=rf"n={n!r}: must be an integer >= 1"):
        q.admit(n, group=0, timeout=1)
    assert q.stats()["admitted"] == 0


@pytest.mark.timeout(10)
@pytest.mark.parametrize("timeout", [math.nan, -1, "5"])
def test_a_wait_that_never_ends_or_makes_no_sense_is_refused(timeout):
    q = LocalTransferQueue(CFG)
    with pytest.raises(ValueError, match=r"timeout=.*must be a number of seconds >= 0"):
        q.get("work", ("prompt",), 1, timeout=timeout)
    with pytest.raises(ValueError, match=r"timeout=.*or None to wait without limit"):
        q.admit(1, group=0, timeout=timeout)


def test_an_infinite_get_timeout_still_returns_once_nothing_is_pending():
    q = LocalTransferQueue(CFG)
    (i,) = q.admit(1, group=0)
    q.write(i, "prompt", "x")
    assert [s.index for s in q.get("work", ("prompt",), 5, timeout=math.inf)] == [i]


@pytest.mark.timeout(10)
def test_a_misspelt_column_raises_naming_the_valid_ones_at_once():
    q = LocalTransferQueue(CFG)
    q.admit(1, group=0)
    with pytest.raises(KeyError, match=r"unknown column\(s\) \['promt'\].*this queue has prompt, out"):
        q.get("work", ("promt",), 1, timeout=30)
    with pytest.raises(ValueError, match=r"columns='prompt': must be a non-empty tuple"):
        q.get("work", "prompt", 1)
    with pytest.raises(ValueError, match="batch_size=0: must be an integer >= 1"):
        q.get("work", ("prompt",), 0)


def test_a_give_back_after_the_last_read_is_counted_as_lost():
    """The last consumer's read retires a sample (its data is freed): it cannot be served
    again, so a give_back then is reported in ``lost``, not ignored."""
    q = LocalTransferQueue(CFG)
    a, b = q.admit(2, group=0)
    for i in (a, b):
        q.write(i, "prompt", "x")
        q.write(i, "out", "y")
    assert len(q.get("work", ("prompt",), 2)) == 2
    assert [s.index for s in q.get("train", ("out",), 1)] == [a]  # a: read by both, retired
    q.give_back("work", [a, b])  # the work worker died after all
    stats = q.stats()
    assert stats["lost"] == {a: "work"} and stats["given_back"] == 1 and stats["retired"] == 1
    assert [s.index for s in q.get("work", ("prompt",), 2)] == [b]  # b is served again; a is gone


@pytest.mark.parametrize("index", [7, -1, "0"])
def test_giving_back_a_sample_the_consumer_does_not_hold_is_refused(index):
    q = LocalTransferQueue(CFG)
    q.admit(1, group=0)
    with pytest.raises(ValueError, match=r"'work' does not hold sample"):
        q.give_back("work", [index])
    with pytest.raises(ValueError, match=r"does not hold sample 0"):
        q.give_back("work", [0])  # admitted, never read by work
    assert q.stats()["given_back"] == 0 and q.stats()["lost"] == {}


@pytest.mark.parametrize("bad, match", [
    (dict(columns="prompt"), r"columns='prompt': must be a non-empty tuple of distinct names.*\('prompt',\)"),
    (dict(columns=()), r"columns=\(\): must be a non-empty tuple"),
    (dict(columns=("a", "a")), r"columns=\('a', 'a'\): must be a non-empty tuple of distinct names"),
    (dict(consumers="train"), r"consumers='train': must be a non-empty tuple"),
    (dict(timeout_s=math.nan), r"timeout_s=nan: must be a number of seconds > 0"),
    (dict(timeout_s=0), r"timeout_s=0: must be a number of seconds > 0"),
    (dict(capacity=2.5), r"capacity=2.5: must be an integer >= 1"),
])
def test_a_queue_config_that_makes_no_sense_is_refused(bad, match):
    values = dict(columns=("prompt",), consumers=("train",), capacity=4, timeout_s=60.0)
    with pytest.raises(ValueError, match=match):
        QueueConfig(**{**values, **bad})


def test_columns_given_as_a_list_are_kept_as_a_tuple():
    assert QueueConfig(columns=["prompt"], consumers=["train"]).columns == ("prompt",)
