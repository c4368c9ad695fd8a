"""Reward overlap (CompassMax §3.2.2)."""

from __future__ import annotations

import time

from minirl.algorithms.reward_overlap import RewardOverlap


def test_reward_overlap_scores_while_generating() -> None:
    """Scores come back while rollouts are still being submitted. Checked by order of events,
    not by a wall-clock bound, which a busy CI box can break: scoring after the fact (no
    overlap) finishes no score before the last rollout is in."""
    scored: list[int] = []

    def slow_score(x: int) -> float:
        time.sleep(0.05)
        scored.append(x)
        return float(x)

    with RewardOverlap(slow_score, workers=4) as overlap:
        for i in range(8):  # "rollout i finishes" every 50 ms
            time.sleep(0.05)
            overlap.submit(i, i)
        scored_while_generating = len(scored)
        rewards = overlap.gather()
    assert rewards == {i: float(i) for i in range(8)}
    assert scored_while_generating >= 1, "no reward was scored before generation ended"
