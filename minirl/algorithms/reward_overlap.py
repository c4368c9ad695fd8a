"""Reward overlap (CompassMax §3.2.2): score a rollout the moment it finishes, while the others
still generate, instead of after the whole batch.

It lives with the algorithms, not in ``minirl.scale_out``, because the synchronous C3PO++ loop
(``minirl.training.c3po_loop``) uses it too, and ``minirl.training`` never imports ``scale_out``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class RewardOverlap:
    """Score rollouts while others are still generating (§3.2.2).

    ``submit(key, *args)`` as each rollout finishes; ``gather()`` waits and returns {key: reward}
    for everything submitted, ``take(keys)`` only for ``keys`` (the rest keep scoring). Use as a
    context manager so the pool is shut down.
    """

    def __init__(self, score: Callable[..., float], workers: int = 4) -> None:
        self._score = score
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: dict[Hashable, Future] = {}

    def submit(self, key: Hashable, *args: Any) -> None:
        if key in self._futures:
            raise ValueError(f"rollout {key!r} was already submitted for scoring")
        self._futures[key] = self._pool.submit(self._score, *args)

    def gather(self) -> dict[Hashable, float]:
        return self.take(list(self._futures))

    def take(self, keys: Sequence[Hashable]) -> dict[Hashable, float]:
        missing = [k for k in keys if k not in self._futures]
        if missing:
            raise KeyError(f"rollouts {missing[:5]} were never submitted for scoring (or were already taken)")
        return {k: self._futures.pop(k).result() for k in keys}

    def __enter__(self) -> "RewardOverlap":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)
