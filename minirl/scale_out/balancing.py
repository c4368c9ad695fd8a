"""Length-aware load balancing (CompassMax §3.1.1).

A synchronous step waits for its slowest worker, and with long-tail lengths a naive split hands
one worker most of the long rollouts. §3.1.1 predicts each prompt's length from a short draft by
the base model, then distributes prompts so every worker gets about the same total expected
decoding length. ``balance`` does that with LPT (longest first, onto the least-loaded worker): its
makespan is within 4/3 of optimal. (Reward overlap, §3.2.2, is ``minirl.algorithms.reward_overlap``.)
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import Any

from minirl.engine.sampling import SamplingParams


def predict_lengths(engine: Any, prompts: list[list[int]], params: SamplingParams, draft_tokens: int = 32,
                    unfinished_guess: int | None = None) -> list[int]:
    """§3.1.1 draft predictor: generate ``draft_tokens`` per prompt; a draft that ends is its own
    length, one that does not is guessed ``unfinished_guess`` (default ``params.max_new_tokens``)."""
    if draft_tokens < 1:
        raise ValueError(f"draft_tokens={draft_tokens}: need >= 1")
    guess = params.max_new_tokens if unfinished_guess is None else unfinished_guess
    drafts = engine.generate(prompts, dataclasses.replace(params, n=1, max_new_tokens=draft_tokens))
    return [len(d.token_ids) if d.finish_reason == "stop" else guess for d in drafts]


def balance(lengths: Sequence[float], n_workers: int) -> list[list[int]]:
    """Indices of ``lengths`` split into ``n_workers`` lists of near-equal total (LPT greedy)."""
    if n_workers < 1:
        raise ValueError(f"n_workers={n_workers}: need >= 1")
    if any(x < 0 for x in lengths):
        raise ValueError("predicted lengths must be >= 0")
    heap = [(0.0, w) for w in range(n_workers)]  # (load, worker)
    out: list[list[int]] = [[] for _ in range(n_workers)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, w = heapq.heappop(heap)
        out[w].append(i)
        heapq.heappush(heap, (load + lengths[i], w))
    return out


def makespan(lengths: Sequence[float], assignment: list[list[int]]) -> float:
    """The slowest worker's total length: what a synchronous step waits for."""
    return max(sum(lengths[i] for i in worker) for worker in assignment)
