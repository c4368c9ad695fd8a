"""Reward workers: the verifier behind a timeout, so one bad sample costs one reward, not the run.

A verifier that raises gives reward 0 (as in ``Trainer.rewards``); one that hangs gives reward
0 after ``timeout_s`` and is counted separately. The hung call keeps running in a daemon thread
(Python cannot kill a thread); a Ray reward actor can be replaced if that ever matters.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from minirl import tasks
from minirl.engine.rollout import Rollout


@dataclass
class Scores:
    rewards: list[float]
    errors: int  # verifier raised
    timeouts: int  # verifier did not answer within the timeout


class RewardWorker:
    """Scores one GRPO group (one prompt's rollouts) with ``task.verify``."""

    def __init__(self, task: tasks.Task, tokenizer, timeout_s: float) -> None:  # noqa: ANN001 - HF tokenizer
        if timeout_s <= 0:
            raise ValueError(f"reward timeout_s={timeout_s}: must be > 0 seconds")
        self.task, self.tokenizer, self.timeout_s = task, tokenizer, timeout_s

    def score(self, problem: tasks.Problem, rollouts: list[Rollout]) -> Scores:
        out = Scores([], 0, 0)
        for r in rollouts:
            text = self.tokenizer.decode(r.token_ids, skip_special_tokens=True)
            result: list = []
            worker = threading.Thread(target=self._verify, args=(problem, text, result), daemon=True)
            worker.start()
            worker.join(self.timeout_s)
            if worker.is_alive():
                out.rewards.append(0.0)
                out.timeouts += 1
            elif isinstance(result[0], BaseException):
                out.rewards.append(0.0)
                out.errors += 1
            else:
                out.rewards.append(float(result[0]))
        return out

    def _verify(self, problem: tasks.Problem, text: str, result: list) -> None:
        try:
            result.append(self.task.verify(problem, text))
        except Exception as e:  # noqa: BLE001 - any verifier bug costs one sample, not the run
            result.append(e)
