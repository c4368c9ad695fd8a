"""TransferQueue (AsyncFlow §3): a streaming data plane between RL stages.

A sample is a row, a column is one stage's output for it (``prompt``, ``rollouts``,
``reward``...; AsyncFlow Fig. 4). The **controller** (§3.3) keeps only metadata: which
columns of each sample are ready, which consumers already read it, when it was admitted.
**Storage** (§3.2) keeps the column data. A consumer (an RL task: rollout, reward, train)
asks for a micro-batch of samples whose needed columns are all ready and that it has not read
yet (§3.3, Fig. 6); each stage therefore starts on a sample as soon as *that sample* is ready,
not when the whole batch is (§4.1).

Invariants (tested): each (sample, column) is written once; each consumer reads each sample
once (unless it hands it back with ``give_back``, e.g. its worker died); at most ``capacity``
samples are in flight (backpressure: ``admit`` blocks). A sample that is not complete
``timeout_s`` after admission is dropped and reported in ``stats()["timed_out"]``; the run
goes on without it. A sample is retired (its data freed) when the last consumer reads it, so
a ``give_back`` after that cannot serve it again: it is reported in ``stats()["lost"]``
(index -> the consumer that gave it back), never dropped without a word.

Every argument is checked where it enters (a count of 0 or a NaN wait used to block forever,
a misspelt column to return ``[]`` after the timeout).

``LocalTransferQueue`` is the in-process implementation (threads); ``minirl.scale_out.ray_queue`` puts
the same ``Controller`` in a Ray actor and the data in Ray's object store.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class QueueConfig:
    """What a queue holds and how much of it."""

    columns: tuple[str, ...]
    """every column a sample has; a sample is complete when all are written (§3.2.1)."""
    consumers: tuple[str, ...]
    """the RL tasks reading from the queue (one controller view each, §3.1); a sample is
    retired (its storage freed) once every consumer has read it."""
    capacity: int = 256
    """backpressure: most samples admitted and not yet retired (AsyncFlow bounds the global
    batch in flight the same way, §3.2)."""
    timeout_s: float = 300.0
    """a sample not complete this long after admission is dropped and reported."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", _names("columns", self.columns, "('prompt', 'rollouts')"))
        object.__setattr__(self, "consumers", _names("consumers", self.consumers, "('rollout', 'train')"))
        _check_count("capacity", self.capacity, "samples in flight")
        if not _is_number(self.timeout_s) or not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r}: must be a number of seconds > 0 (math.inf: never "
                             f"drop an incomplete sample)")


def _names(what: str, value: object, example: str) -> tuple[str, ...]:
    """A non-empty tuple of distinct names; a bare string is refused (it would be read as its
    letters: ``"prompt"`` as the columns p, r, o, ...)."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not value \
            or not all(isinstance(v, str) for v in value) or len(set(value)) != len(value):
        raise ValueError(f"{what}={value!r}: must be a non-empty tuple of distinct names, e.g. {what}={example}"
                         + (f" (write ({value!r},) for one)" if isinstance(value, str) else ""))
    return tuple(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _check_count(what: str, value: object, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}={value!r}: must be an integer >= 1 ({unit})")


def check_timeout(value: object, allow_none: bool) -> None:
    """A wait in seconds: a number >= 0 (``math.inf``: no limit), or None where allowed
    (no limit). NaN is refused: every comparison with it is False, so a wait never ends."""
    if value is None and allow_none:
        return
    if not _is_number(value) or value < 0:
        raise ValueError(f"timeout={value!r}: must be a number of seconds >= 0"
                         + (", or None to wait without limit" if allow_none else " (math.inf: no limit)"))


@dataclass
class Sample:
    """What a consumer gets: the sample's global index, its group (the step it belongs to) and
    the requested columns (values in-process, ``ray.ObjectRef`` from the Ray queue)."""

    index: int
    group: int
    data: dict[str, Any]


@dataclass
class _Meta:
    group: int
    admitted: float
    ready: set[str] = field(default_factory=set)
    read_by: set[str] = field(default_factory=set)


class Controller:
    """Metadata only (§3.3): column readiness, consumption records, capacity, timeouts.

    Not thread-safe by itself: ``LocalTransferQueue`` guards it with a lock, the Ray queue
    runs it inside one actor (which serialises calls)."""

    def __init__(self, config: QueueConfig) -> None:
        self.cfg = config
        self.meta: dict[int, _Meta] = {}
        self.next_index = 0
        self.counts = {"admitted": 0, "retired": 0, "given_back": 0}
        self.timed_out: dict[int, list[str]] = {}  # index -> the columns that never arrived
        self.dropped: list[int] = []  # timed out since the storage last freed them (``take_dropped``)
        self.lost: dict[int, str] = {}  # index -> consumer that gave it back after it was retired

    def admit(self, n: int, group: int) -> list[int] | None:
        """Allocate ``n`` global indices in ``group``; None while that would exceed capacity."""
        _check_count("n", n, "samples to admit")
        if n > self.cfg.capacity:
            raise ValueError(f"admitting {n} samples at once exceeds capacity={self.cfg.capacity}; "
                             f"raise QueueConfig.capacity or admit in smaller parts")
        self.expire()
        if len(self.meta) + n > self.cfg.capacity:
            return None
        now = time.monotonic()
        ids = list(range(self.next_index, self.next_index + n))
        for i in ids:
            self.meta[i] = _Meta(group, now)
        self.next_index += n
        self.counts["admitted"] += n
        return ids

    def mark_ready(self, index: int, column: str) -> None:
        """A storage unit wrote ``column`` of ``index`` (the notification of §3.2.2)."""
        if column not in self.cfg.columns:
            raise KeyError(f"unknown column {column!r}; this queue has {', '.join(self.cfg.columns)}")
        if index in self.timed_out:
            return  # a late write for a dropped sample: ignored, it was already reported
        m = self._meta(index)
        if column in m.ready:
            raise ValueError(f"sample {index}: column {column!r} written twice; each (sample, column) "
                             f"is written once (a worker handed it back must not also finish it)")
        m.ready.add(column)

    def claim(self, consumer: str, columns: tuple[str, ...], batch_size: int,
              group: int | None = None) -> tuple[list[tuple[int, int]], list[int], int]:
        """Up to ``batch_size`` (index, group) ready for ``consumer``, marked read; plus the
        indices this retires, and how many matching samples are still pending."""
        self._check_consumer(consumer)
        if isinstance(columns, str) or not isinstance(columns, (tuple, list)) or not columns:
            raise ValueError(f"columns={columns!r}: must be a non-empty tuple of column names, e.g. "
                             f"{self.cfg.columns[:1]!r}")
        unknown = [c for c in columns if c not in self.cfg.columns]
        if unknown:
            raise KeyError(f"unknown column(s) {unknown} in columns={tuple(columns)!r}; this queue has "
                           f"{', '.join(self.cfg.columns)}")
        _check_count("batch_size", batch_size, "samples per get")
        self.expire()
        need, got, pending = set(columns), [], 0
        for i, m in self.meta.items():
            if consumer in m.read_by or (group is not None and m.group != group):
                continue
            if need <= m.ready and len(got) < batch_size:
                got.append((i, m.group))
            else:
                pending += 1
        retired = []
        for i, _ in got:
            self.meta[i].read_by.add(consumer)
            if self.meta[i].read_by >= set(self.cfg.consumers):
                del self.meta[i]
                retired.append(i)
        self.counts["retired"] += len(retired)
        return got, retired, pending

    def give_back(self, consumer: str, indices: list[int]) -> None:
        """``consumer`` read these but will not finish them (its worker died): serve them again.

        A sample retired meanwhile (every consumer read it: its data is freed) cannot be; it
        is counted in ``stats()["lost"]``. A timed-out one is already in ``timed_out``. Giving
        back a sample ``consumer`` does not hold (never admitted, not read, given back twice)
        is a caller's bug and raises before anything changes."""
        self._check_consumer(consumer)
        for i in indices:
            if not self._may_give_back(consumer, i):
                raise ValueError(f"give_back({consumer!r}, [{i}]): {consumer!r} does not hold sample {i} "
                                 f"(never admitted, not read by it, or already given back); give back only "
                                 f"indices a get() returned to this consumer")
        for i in indices:
            if i in self.meta:
                self.meta[i].read_by.discard(consumer)
                self.counts["given_back"] += 1
            elif i not in self.timed_out:
                self.lost[i] = consumer

    def expire(self) -> list[int]:
        """Drop samples incomplete after ``timeout_s``; they are reported, never served."""
        now, dropped = time.monotonic(), []
        for i, m in list(self.meta.items()):
            if now - m.admitted > self.cfg.timeout_s and m.ready != set(self.cfg.columns):
                self.timed_out[i] = sorted(set(self.cfg.columns) - m.ready)
                del self.meta[i]
                dropped.append(i)
        self.dropped += dropped
        return dropped

    def take_dropped(self) -> list[int]:
        """Timed-out indices whose column data storage should now free."""
        out, self.dropped = self.dropped, []
        return out

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "in_flight": len(self.meta), "timed_out": dict(self.timed_out), "lost": dict(self.lost)}

    def _may_give_back(self, consumer: str, index: object) -> bool:
        """Admitted once, and not in flight unread by ``consumer`` (retired or timed out: fine)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.next_index:
            return False
        return index not in self.meta or consumer in self.meta[index].read_by

    def _check_consumer(self, consumer: str) -> None:
        if consumer not in self.cfg.consumers:
            raise KeyError(f"unknown consumer {consumer!r}; this queue has {', '.join(self.cfg.consumers)}")

    def _meta(self, index: int) -> _Meta:
        if index not in self.meta:
            raise KeyError(f"sample {index} is not in flight (never admitted, or already retired)")
        return self.meta[index]


class TransferQueue(Protocol):
    """The interface both implementations share (in-process and Ray)."""

    def admit(self, n: int, group: int, timeout: float | None = None) -> list[int]: ...

    def write(self, index: int, column: str, value: Any) -> None: ...

    def get(self, consumer: str, columns: tuple[str, ...], batch_size: int, group: int | None = None,
            timeout: float = 0.0) -> list[Sample]: ...

    def give_back(self, consumer: str, indices: list[int]) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class LocalTransferQueue:
    """In-process TransferQueue: a ``Controller`` plus a dict as the storage unit, guarded by
    one condition variable so producer and consumer threads can block on each other."""

    def __init__(self, config: QueueConfig) -> None:
        self.controller = Controller(config)
        self.data: dict[tuple[int, str], Any] = {}
        self.cond = threading.Condition()
        self.depth: list[tuple[float, int]] = []  # (time, samples in flight) after each change

    def admit(self, n: int, group: int, timeout: float | None = None) -> list[int]:
        """Block while the queue is full (backpressure); ``TimeoutError`` after ``timeout`` s."""
        check_timeout(timeout, allow_none=True)
        with self.cond:
            ids = self.cond.wait_for(lambda: self.controller.admit(n, group), timeout)
            if ids is None:
                raise TimeoutError(f"queue full: {self.controller.stats()['in_flight']} samples in flight "
                                   f"(capacity {self.controller.cfg.capacity}) for {timeout} s; consumers are "
                                   f"not keeping up, raise capacity or add workers")
            self._record_depth()
            return ids

    def write(self, index: int, column: str, value: Any) -> None:
        with self.cond:
            self.controller.mark_ready(index, column)
            if index in self.controller.meta:
                self.data[(index, column)] = value
            self.cond.notify_all()

    def get(self, consumer: str, columns: tuple[str, ...], batch_size: int, group: int | None = None,
            timeout: float = 0.0) -> list[Sample]:
        """Wait up to ``timeout`` s for ``batch_size`` ready samples (fewer when the group has
        fewer left); return what is ready then, possibly nothing."""
        check_timeout(timeout, allow_none=False)
        deadline = time.monotonic() + timeout
        out: list[Sample] = []
        with self.cond:
            while True:
                got, retired, pending = self.controller.claim(consumer, columns, batch_size - len(out), group)
                out += [Sample(i, g, {c: self.data[(i, c)] for c in columns}) for i, g in got]
                retired += self.controller.take_dropped()
                for i in retired:
                    for c in self.controller.cfg.columns:
                        self.data.pop((i, c), None)
                if retired:
                    self._record_depth()
                    self.cond.notify_all()
                left = deadline - time.monotonic()
                if len(out) >= batch_size or pending == 0 or left <= 0:
                    return out
                self.cond.wait(min(left, 0.1))  # wake up now and then to expire stuck samples

    def give_back(self, consumer: str, indices: list[int]) -> None:
        with self.cond:
            self.controller.give_back(consumer, indices)
            self.cond.notify_all()

    def stats(self) -> dict[str, Any]:
        with self.cond:
            self.controller.expire()
            return {**self.controller.stats(), "depth": list(self.depth)}

    def _record_depth(self) -> None:
        self.depth.append((time.time(), len(self.controller.meta)))
