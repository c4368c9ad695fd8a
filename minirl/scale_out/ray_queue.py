"""TransferQueue on Ray (AsyncFlow §3): the controller in one actor, column data in the object store.

Same interface as ``minirl.scale_out.transfer_queue.LocalTransferQueue``; ``get`` hands out
``ray.ObjectRef``s, so data moves worker-to-worker and never through the driver. A value is
``ray.put`` once by its writer (or is already a task's return ref); a storage unit keeps the
ref, addressed by the sample's global index (``index % n_units``, §3.2.1), and notifies the
controller that the column is ready (§3.2.2). Consumers ask the controller for ready indices
(§3.3) and then read the refs from the units. Refs are stored boxed in a list so Ray does not
resolve them on the way in.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from minirl.scale_out.transfer_queue import Controller, QueueConfig, Sample, check_timeout

_POLL_S = 0.02


@ray.remote(num_cpus=0)
class ControllerActor:
    """The metadata plane (§3.3); one actor serialises every call, so no locks."""

    def __init__(self, config: QueueConfig) -> None:
        self.c = Controller(config)

    def admit(self, n: int, group: int) -> list[int] | None:
        return self.c.admit(n, group)

    def mark_ready(self, index: int, column: str) -> None:
        self.c.mark_ready(index, column)

    def claim(self, consumer: str, columns: tuple[str, ...], batch_size: int, group: int | None):
        got, retired, pending = self.c.claim(consumer, columns, batch_size, group)
        return got, retired + self.c.take_dropped(), pending

    def give_back(self, consumer: str, indices: list[int]) -> None:
        self.c.give_back(consumer, indices)

    def stats(self) -> dict[str, Any]:
        self.c.expire()
        return self.c.stats()


@ray.remote(num_cpus=0)
class StorageUnit:
    """A slice of the data plane (§3.2): ``(index, column) -> ObjectRef``."""

    def __init__(self, controller: ControllerActor) -> None:
        self.controller = controller
        self.refs: dict[tuple[int, str], ray.ObjectRef] = {}

    def put(self, index: int, column: str, boxed: list[ray.ObjectRef]) -> None:
        ray.get(self.controller.mark_ready.remote(index, column))  # raises on a second write: nothing stored
        self.refs[(index, column)] = boxed[0]

    def read(self, indices: list[int], columns: tuple[str, ...]) -> dict[int, dict[str, list[ray.ObjectRef]]]:
        return {i: {c: [self.refs[(i, c)]] for c in columns} for i in indices}

    def drop(self, indices: list[int]) -> None:
        for key in [k for k in self.refs if k[0] in set(indices)]:
            del self.refs[key]


class RayTransferQueue:
    """Client handle (picklable: pass it to actors that write into the queue)."""

    def __init__(self, config: QueueConfig, n_units: int = 2) -> None:
        self.cfg = config
        self.controller = ControllerActor.remote(config)
        self.units = [StorageUnit.remote(self.controller) for _ in range(n_units)]
        self.depth: list[tuple[float, int]] = []

    def admit(self, n: int, group: int, timeout: float | None = None) -> list[int]:
        """Block while full (backpressure); ``TimeoutError`` after ``timeout`` s."""
        check_timeout(timeout, allow_none=True)  # NaN compares False: the wait would never end
        deadline = None if timeout is None else time.monotonic() + timeout
        while (ids := ray.get(self.controller.admit.remote(n, group))) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"queue full (capacity {self.cfg.capacity}) for {timeout} s; consumers are not "
                                   f"keeping up, raise capacity or add workers")
            time.sleep(_POLL_S)
        self._record_depth()
        return ids

    def write(self, index: int, column: str, value: Any) -> None:
        ref = value if isinstance(value, ray.ObjectRef) else ray.put(value)
        ray.get(self.units[index % len(self.units)].put.remote(index, column, [ref]))

    def get(self, consumer: str, columns: tuple[str, ...], batch_size: int, group: int | None = None,
            timeout: float = 0.0) -> list[Sample]:
        """Like the local queue's ``get``; the values are ``ObjectRef``s."""
        check_timeout(timeout, allow_none=False)
        deadline, out = time.monotonic() + timeout, []
        while True:
            got, retired, pending = ray.get(self.controller.claim.remote(consumer, columns, batch_size - len(out), group))
            out += self._read(got, columns)
            if retired:
                for unit in self.units:
                    unit.drop.remote(retired)
                self._record_depth()
            if len(out) >= batch_size or pending == 0 or time.monotonic() >= deadline:
                return out
            time.sleep(_POLL_S)

    def give_back(self, consumer: str, indices: list[int]) -> None:
        ray.get(self.controller.give_back.remote(consumer, indices))

    def stats(self) -> dict[str, Any]:
        return {**ray.get(self.controller.stats.remote()), "depth": list(self.depth)}

    def close(self) -> None:
        for actor in [self.controller, *self.units]:
            ray.kill(actor)

    def _read(self, got: list[tuple[int, int]], columns: tuple[str, ...]) -> list[Sample]:
        if not got:
            return []
        groups = dict(got)
        by_unit: dict[int, list[int]] = {}
        for i, _ in got:
            by_unit.setdefault(i % len(self.units), []).append(i)
        parts = ray.get([self.units[u].read.remote(ids, columns) for u, ids in by_unit.items()])
        return [Sample(i, groups[i], {c: boxed[0] for c, boxed in cols.items()}) for part in parts
                for i, cols in part.items()]

    def _record_depth(self) -> None:
        self.depth.append((time.time(), ray.get(self.controller.stats.remote())["in_flight"]))
