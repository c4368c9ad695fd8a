"""The trainer side of an RL step, split from generation so another loop can feed it.

``minirl.training.trainer.Trainer.train_step`` generates, scores and updates in one call. The async and
Ray loops (``minirl.scale_out.async_loop``) generate elsewhere (another thread, another process) and on
older weights (AsyncFlow §4.2.2), so they need the step *after* generation: ``Trainer.learn``
(advantages -> old logprobs -> corrections -> updates) on rollouts and rewards they bring, plus
the policy-version bookkeeping that bounds staleness. A lockstep loop over it reproduces the
core's numbers for the same rollouts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minirl import tasks
from minirl.engine.rollout import Rollout

from minirl.training import checkpointing
from minirl.training.sft import encode
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import Trainer


class _NoEngine:
    """Stands in for the rollout engine where the learner never generates (a Ray trainer actor)."""

    def generate(self, prompts, params):  # noqa: ANN001 - protocol stub
        raise RuntimeError("this Learner has no rollout engine; generation runs in the rollout workers")

    def load_weights(self, model) -> None:  # noqa: ANN001
        pass


class Learner:
    """A ``Trainer`` used piecewise. ``version`` counts the updates applied: the policy version
    a rollout was sampled under is the learner's ``version`` when its weights were published."""

    def __init__(self, config: TrainConfig, max_staleness: int = 0, with_engine: bool = True) -> None:
        self.trainer = Trainer(config, None if with_engine else _NoEngine())
        self.cfg = config
        self.max_staleness = max_staleness
        self.version = 0

    @property
    def engine(self):  # noqa: ANN201 - the core's RolloutEngine
        return self.trainer.engine

    def problems(self, step: int) -> list[tuple[tasks.Problem, list[int]]]:
        """Step ``step``'s prompts (the core's data order) with their token ids."""
        return [(p, encode(self.trainer.tokenizer, p.prompt)[0]) for p in self.trainer.problems(step)]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A detached copy of the master weights (fp32 whatever ``trainer_dtype``): what is
        published to the rollout workers, as the weight sync loads them."""
        return {k: v.detach().clone() for k, v in self.trainer.master.state_dict().items()}

    def learn(self, step: int, rollouts: list[Rollout], rewards: torch.Tensor, token_versions: list[torch.Tensor]
              ) -> dict[str, float]:
        """One update on prompt-major ``rollouts`` (``group_size`` per prompt) sampled under the
        per-token policy versions ``token_versions``; refuses tokens older than ``max_staleness``."""
        stale = torch.cat([self.version - v for v in token_versions])
        if stale.numel() and int(stale.max()) > self.max_staleness:
            raise RuntimeError(f"step {step}: a token sampled under policy version {self.version - int(stale.max())} "
                               f"is {int(stale.max())} updates old, over max_staleness={self.max_staleness}; "
                               f"the loop must not schedule rollouts further ahead than max_staleness")
        metrics = self.trainer.learn(step, rollouts, rewards)
        self.version += 1
        return {**metrics, "staleness_max": float(stale.max()) if stale.numel() else 0.0,
                "staleness_mean": float(stale.float().mean()) if stale.numel() else 0.0}

    def save(self, path: Path, step: int, rows: list[dict]) -> None:
        """Checkpoint (core format) after ``step`` steps, with the loop's metric rows."""
        checkpointing.save(path, self.trainer.master, self.trainer.opt,
                           {"step": step, "version": self.version, "rows": rows, "config": self.cfg.to_dict()})

    def restore(self, path: Path) -> tuple[int, list[dict]]:
        """Load a checkpoint written by ``save``: -> (steps done, metric rows)."""
        state = checkpointing.load(path, self.trainer.master, self.trainer.opt)
        self.trainer.sync_compute()
        self.version = state["version"]
        return state["step"], state["rows"]
