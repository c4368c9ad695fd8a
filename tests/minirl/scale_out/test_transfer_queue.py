"""TransferQueue invariants (AsyncFlow §3): write once, read once per consumer, backpressure,
timeouts reported while the rest flows on."""

from __future__ import annotations

import threading
import time

import pytest

from minirl.scale_out.transfer_queue import LocalTransferQueue, QueueConfig

CFG = QueueConfig(columns=("prompt", "out"), consumers=("work", "train"), capacity=4, timeout_s=60)


def test_each_column_written_once_and_read_once_per_consumer():
    q = LocalTransferQueue(CFG)
    ids = q.admit(3, group=0)
    for i in ids:
        q.write(i, "prompt", f"p{i}")
    with pytest.raises(ValueError, match="written twice"):
        q.write(ids[0], "prompt", "again")
    work = q.get("work", ("prompt",), 10, group=0)
    assert sorted(s.index for s in work) == ids and q.get("work", ("prompt",), 10) == []
    assert q.get("train", ("prompt", "out"), 10) == []  # "out" not ready: train sees nothing yet
    for s in work:
        q.write(s.index, "out", s.data["prompt"].upper())
    train = q.get("train", ("prompt", "out"), 10, group=0)
    assert {s.index: s.data["out"] for s in train} == {i: f"P{i}" for i in ids}
    assert q.stats()["in_flight"] == 0 and q.stats()["retired"] == 3  # read by every consumer -> freed
    assert q.data == {}


def test_give_back_serves_a_sample_again_to_that_consumer_only():
    q = LocalTransferQueue(CFG)
    (i,) = q.admit(1, group=0)
    q.write(i, "prompt", "x")
    assert [s.index for s in q.get("work", ("prompt",), 1)] == [i]
    q.give_back("work", [i])  # its worker died
    assert [s.index for s in q.get("work", ("prompt",), 1)] == [i]
    assert q.stats()["given_back"] == 1


def test_backpressure_caps_in_flight_samples():
    q = LocalTransferQueue(CFG)
    peak, n = [0], 40

    def producer():
        for g in range(n):
            (i,) = q.admit(1, group=g)
            q.write(i, "prompt", g)
            q.write(i, "out", g)
            peak[0] = max(peak[0], q.stats()["in_flight"])

    t = threading.Thread(target=producer)
    t.start()
    seen = []
    while len(seen) < n:
        seen += [s.data["out"] for s in q.get("train", ("out",), 2, timeout=0.05)]
        q.get("work", ("prompt",), 2)
    t.join()
    assert sorted(seen) == list(range(n)) and peak[0] <= CFG.capacity
    with pytest.raises(TimeoutError, match="queue full"):
        full = LocalTransferQueue(CFG)
        full.admit(4, group=0)
        full.admit(1, group=0, timeout=0.1)


def test_a_sample_that_never_completes_times_out_is_reported_and_the_rest_flows():
    q = LocalTransferQueue(QueueConfig(("prompt", "out"), ("train",), capacity=8, timeout_s=0.3))
    stuck, ok = q.admit(2, group=0)
    q.write(stuck, "prompt", "never finished")
    q.write(ok, "prompt", "a")
    q.write(ok, "out", "b")
    start = time.monotonic()
    got = q.get("train", ("prompt", "out"), 2, group=0, timeout=5)
    assert [s.index for s in got] == [ok] and time.monotonic() - start < 2
    assert q.stats()["timed_out"] == {stuck: ["out"]} and q.stats()["in_flight"] == 0
    q.write(stuck, "out", "late")  # a late write for a dropped sample is ignored, not an error
    assert q.admit(1, group=1)  # the run goes on


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        QueueConfig(("a",), ("b",), capacity=0)
    q = LocalTransferQueue(CFG)
    with pytest.raises(KeyError, match="unknown consumer"):
        q.get("nobody", ("prompt",), 1)
