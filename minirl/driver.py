"""Which loop drives a config: ``minirl.train`` (and ``train_c3po``, its C3PO++ shorthand).

``mode: sync`` runs the ``Trainer`` loop here; ``mode: async|ray`` hand the same
``Trainer.learn`` to the producer-consumer driver (``minirl.scale_out.async_loop``), which builds on the
trainer. The choice sits at minirl's root, above both subpackages, so the arrows point one way:
driver -> (training, scale_out) and scale_out -> training; ``minirl.training`` never imports
``minirl.scale_out`` (tests/test_layering.py).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from minirl.algorithms.c3po import PoolRollout
from minirl.scale_out import async_loop
from minirl.training import run_dir
from minirl.training.attention import resolved
from minirl.training.resume import check_before_loading
from minirl.training.c3po_loop import C3poGroups, GroupedPrompts
from minirl.engines import RolloutEngine
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import Trainer, TrainResult


def train(config: TrainConfig | dict | str | os.PathLike, engine: RolloutEngine | None = None,
          resume: bool = False, overwrite: bool = True) -> TrainResult:
    """Run RL as ``config`` says (a ``TrainConfig``, a dict of its fields, or a YAML path).
    ``resume=True`` continues the run in ``out_dir`` from its checkpoint; otherwise a previous
    run's own files there are replaced, or refused with ``overwrite=False`` (``mlab train``
    without ``--overwrite``). ``mode: async`` / ``ray`` run the same ``Trainer.learn`` under the
    producer-consumer driver (``minirl.scale_out.async_loop``), which brings its own rollout
    engines (``engine`` must be None); every mode shares one run lifecycle
    (``minirl.training.lifecycle``)."""
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    elif not isinstance(config, TrainConfig):
        config = TrainConfig.from_yaml(config)
    run_dir.check(config.out_dir, resume, overwrite)  # refused before any model loads
    config = resolved(config)  # every mode's saved config names the attention kernel, never `auto`
    if resume:
        check_before_loading(config)  # and so is a resume the checkpoint cannot continue
    if config.mode != "sync":
        if engine is not None:
            raise ValueError(f"mode={config.mode!r} builds its rollout engines from config.engine in its own workers; "
                             f"pass engine=None, or use mode: sync to train with this engine object")
        return async_loop.run(config, resume, overwrite=overwrite)
    return Trainer(config, engine).run(resume, overwrite)


@dataclass
class C3poTrainResult:
    log_path: Path
    rows: list[dict]  # one per iteration, also in ``log_path``
    trainer: Trainer  # model, engine and evaluate() after the last update
    trained: list[list[PoolRollout]]  # per iteration, the rollouts trained on (whole groups)
    prompts: GroupedPrompts  # uid -> group -> problem
    dropped_groups: set[int]  # groups that lost a member to the retention limit


def train_c3po(train: TrainConfig, token_budget: int, retention: int = 2, chunk_tokens: int = 8,
               pool_capacity: int | None = None, engine: RolloutEngine | None = None) -> C3poTrainResult:
    """``train`` with ``rollout: c3po`` and Φ = ``token_budget``, σ = ``retention``, Ω =
    ``pool_capacity`` (default one synchronous step's); the ``Trainer`` loop runs it. Returns the
    rollouts trained on per iteration as well as the metric rows."""
    config = dataclasses.replace(train, rollout="c3po", c3po_token_budget=token_budget, c3po_retention=retention,
                                 c3po_chunk_tokens=chunk_tokens, c3po_pool_capacity=pool_capacity or 0)
    trainer = Trainer(config, engine)
    result = trainer.run()
    source: C3poGroups = trainer.groups
    return C3poTrainResult(result.log_path, result.rows, trainer, source.trained, source.prompts, source.dead)
