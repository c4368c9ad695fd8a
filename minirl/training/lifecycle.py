"""One run's life in its ``out_dir``, the same for ``mode: sync``, ``async`` and ``ray``.

The modes differ in where rollouts are made and where the model lives (this process, or a Ray
actor); what a run leaves behind and how it continues must not differ, so it lives here once:

* the run directory: locked for the run, a manifest of what it wrote, the previous run replaced
  only by its own files (``minirl.training.run_dir``);
* ``config.yaml`` at each start, ``metrics.nc`` after every step, TensorBoard scalars
  (``report_to: tensorboard``), ``curves.png`` at the end (and ``monitor.png`` with the monitor on);
* evaluation of the policy before the first update (step 0), before every ``eval_every``-th
  step's update, and of the final policy after the last update (a row of its own at
  ``step = steps``, eval columns only);
* checkpoints every ``checkpoint_every`` steps and after the last one;
* the mismatch monitor (``monitor_every``, ``minirl.training.monitor``): a reading of the trainer
  against the rollout engine at every step divisible by ``monitor_every``, from the first step
  through ``steps`` (the final policy), each after the weight sync, kept in ``metrics.nc`` and
  checkpoints, summarised in one sentence at the end;
* resume: each changed value applied or refused by name (``minirl.training.resume``);
* a stop after ``max_nan_steps`` non-finite steps, and Ctrl-C, each saying what is intact.

A mode supplies a ``Policy`` (checkpoint, restore, held-out evaluation, wherever its model lives) and a loop
that calls ``evaluation_due``/``record`` per step. The monitor reads the policy's trainer (``model``,
``engine``, ``tokenizer``, ``eval_set``: the sync ``Trainer`` itself, or ``policy.learner.trainer``), and
calls ``policy.serve_latest()`` where the engine may lag the published weights (async); a policy whose
model and engines live elsewhere (Ray) reads it there, ``policy.monitor_reader(sites, mode, tokens)`` giving the
reader. A loop whose engine may be generating when ``record`` runs waits for it first where
``monitor_due(step + 1)``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import yaml

from minirl.training import checkpointing, monitor, monitor_report, plot, resume
from minirl.training.resume import RunInterrupted
from minirl.training.run_dir import EVENTS, RunDir
from minirl.training.run_log import RunLog
from minirl.training.train_config import TrainConfig


class Policy(Protocol):
    """The model being trained, wherever it lives."""

    def save_checkpoint(self, path: Path, state: dict) -> None:
        """Weights, optimizer, RNGs and the JSON-able ``state`` (``minirl.training.checkpointing``)."""

    def load_checkpoint(self, path: Path) -> dict:
        """Restore what ``save_checkpoint`` wrote; -> its ``state``."""

    def resumed(self, step: int) -> None:
        """After a restore at ``step``: take the config's optimizer values, serve the restored weights."""

    def held_out(self) -> dict[str, float]:
        """Held-out metrics of the current policy (``eval_accuracy``, ``eval_reward``)."""


class Lifecycle:
    """``open`` a run directory, then ``run`` a mode's loop in it."""

    def __init__(self, config: TrainConfig, run_dir: RunDir) -> None:
        self.cfg, self.dir, self.out = config, run_dir, run_dir.path
        self.log = RunLog(self.out / "metrics.nc")
        self.step, self.nan_streak = 0, 0
        self.saved_step: int | None = None  # step of the last checkpoint this run wrote or resumed from
        self.policy: Policy | None = None
        self.board = None
        self.read: Callable[[int], monitor.Reading] | None = None  # the monitor's reader, with monitor_every > 0

    @classmethod
    @contextmanager
    def open(cls, config: TrainConfig, resume: bool, overwrite: bool = True) -> Iterator[Lifecycle]:
        """Lock ``config.out_dir`` for this run (refused by name when it cannot take it:
        ``minirl.training.run_dir``); released on exit, however the run ends."""
        run_dir = RunDir.open(config.out_dir, resume, overwrite)
        try:
            yield cls(config, run_dir)
        finally:
            run_dir.close()

    def run(self, policy: Policy, resume: bool, loop: Callable[[int], None]) -> None:
        """Start (fresh or resumed), ``loop(first_step)``, then evaluate the final policy and
        plot. Ctrl-C raises ``RunInterrupted`` saying which checkpoint is intact."""
        self.policy = policy
        self._restore() if resume else self._start()
        self.out.joinpath("config.yaml").write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
        self._open_board()
        try:
            self._open_monitor()
            if self.monitor_due(self.step) and all(r["step"] != self.step for r in self.log.readings):
                self._watch(self.step)  # a resumed run may have read this step before its checkpoint
            loop(self.step)
            if self.cfg.eval_every:  # the policy after the last update, in a row of its own
                self.log.append(self.cfg.steps, self.policy.held_out())
                self._board_row(self.cfg.steps, self.log.rows[-1])
        except KeyboardInterrupt:
            kept = (f"the checkpoint at step {self.saved_step} is intact; resume with --resume"
                    if self.saved_step is not None else
                    f"no checkpoint was written (checkpoint_every={self.cfg.checkpoint_every}), so it cannot be "
                    f"resumed; start again with --overwrite")
            raise RunInterrupted(f"interrupted at step {self.step}; {kept}") from None
        finally:
            if self.log.unwritten:  # a reading (or note) after the last step's row, e.g. of a 0-step run
                self.log.flush()
            if self.board is not None:
                self.board.close()
        plot.plot_runs([self.out], self.out / "curves.png")
        if self.log.readings:  # the monitor's heatmap and its sentence
            readings = monitor_report.load(self.log.path)
            self.dir.claim("monitor.png")
            plot.plot_sites(self.out, self.out / "monitor.png", readings)
            print(f"mismatch monitor: {monitor_report.sentence(readings)}")

    def monitor_due(self, step: int) -> bool:
        """Read the mismatch monitor at ``step`` (after the weight sync that precedes it)."""
        every = self.cfg.monitor_every
        return bool(every) and step % every == 0 and step <= self.cfg.steps

    def evaluation_due(self, step: int) -> bool:
        """Evaluate before step ``step``'s update (the final policy is ``run``'s)."""
        return bool(self.cfg.eval_every) and step % self.cfg.eval_every == 0

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step`` is done: read the monitor when due (after the step's weight sync: the engine
        serves the next policy), log its row (and the reading, in one write), stop on repeated
        non-finite steps, checkpoint when due."""
        if self.monitor_due(step + 1):
            self._watch(step + 1)
        self.log.append(step, metrics)
        self._board_row(step, self.log.rows[-1])
        self.step = step + 1
        if metrics.get("nan_skipped"):
            self.nan_streak += 1
            if self.nan_streak >= self.cfg.max_nan_steps:
                kept = (f"The checkpoint at step {self.saved_step} ({self.out / 'checkpoint'}) is intact"
                        if self.saved_step is not None else
                        f"No checkpoint was written (checkpoint_every={self.cfg.checkpoint_every})")
                plot.plot_runs([self.out], self.out / "curves.png")
                raise RuntimeError(
                    f"loss was not finite for {self.nan_streak} steps in a row (last: step {step}); each was "
                    f"skipped and the run stopped. {kept}; lower lr, enable a correction (icepop/tis), or "
                    f"raise max_nan_steps")
        else:
            self.nan_streak = 0
        every = self.cfg.checkpoint_every
        if every and (self.step % every == 0 or self.step == self.cfg.steps):
            self.policy.save_checkpoint(self.out / "checkpoint", {
                "step": self.step, "nan_streak": self.nan_streak, "rows": self.log.rows, "events": self.log.events,
                "readings": self.log.readings,
                "config": self.cfg.to_dict(), "model_identity": checkpointing.model_identity(self.cfg.model)})
            self.saved_step = self.step

    # ------------------------------------------------------------------ start
    def _start(self) -> None:
        kept = self.dir.start()
        if kept:
            print(f"{self.out}: kept files this run did not write: {', '.join(kept)}", file=sys.stderr)

    def _restore(self) -> None:
        """Continue from the checkpoint: refuse what it cannot continue (a damaged file, a step
        outside the run, a changed model/task/seed...), apply what may change (``minirl.training.resume``)."""
        path = self.out / "checkpoint"
        recovered = not path.exists()  # only .checkpoint.old survived a crash mid-save
        state = self.policy.load_checkpoint(path)
        applied = resume.check(self.cfg, state, path)
        step, rows = state["step"], state["rows"]
        self.policy.resumed(step)
        self.step, self.nan_streak, self.saved_step = step, int(state.get("nan_streak", 0)), step
        self.log = RunLog(self.log.path, rows, state.get("events"), state.get("readings"))
        if recovered:
            self.log.note(step, f"resumed from {path.with_name('.checkpoint.old')} (a save was interrupted)")
        for key, (old, new) in applied.items():
            self.log.note(step, f"{key} changed on resume at step {step}: {old!r} -> {new!r}")
        self.log.flush()

    # ------------------------------------------------------------------ mismatch monitor
    def _trainer(self):  # noqa: ANN202 - the Trainer, wherever the mode keeps it
        return getattr(getattr(self.policy, "learner", None), "trainer", self.policy)

    def _open_monitor(self) -> None:
        """The monitor's reader: ``monitor.PROVIDER``'s monitor on the probe (held-out problems),
        here, or where the policy keeps its engines (``policy.monitor_reader``)."""
        if not self.cfg.monitor_every:
            return
        elsewhere = getattr(self.policy, "monitor_reader", None)
        if elsewhere is not None:
            self.read = elsewhere(self.cfg.monitor_sites, self.cfg.monitor_mode, self.cfg.monitor_tokens)
            return
        trainer, watcher = self._trainer(), monitor.load(self.cfg.monitor_sites, self.cfg.monitor_mode)
        probe = monitor.probe(trainer, self.cfg.monitor_tokens)
        self.read = lambda step: watcher.measure(step, trainer.model, trainer.engine, probe)

    def _watch(self, step: int) -> None:
        """One reading at ``step``: kept in the log (and TensorBoard), with the seconds it took."""
        t = time.perf_counter()
        serve = getattr(self.policy, "serve_latest", None)
        if serve is not None:  # async: the engine loads published weights only when it next generates
            serve()
        reading = self.read(step).to_dict()
        self.log.read({**reading, "seconds": time.perf_counter() - t})
        if self.board is not None:
            for site, err in reading["rel_l2"].items():
                self.board.add_scalar(f"monitor_rel_l2/{site}", err, step)
            for layer, flips in reading["routing_flips"].items():
                self.board.add_scalar(f"monitor_routing_flips/L{layer}", flips, step)

    # ------------------------------------------------------------------ TensorBoard
    def _open_board(self) -> None:
        if self.cfg.report_to != "tensorboard":
            return
        from torch.utils.tensorboard import SummaryWriter

        folder = self.out / "tensorboard"
        before = set(folder.iterdir()) if folder.is_dir() else set()
        self.board = SummaryWriter(str(folder), purge_step=self.step)
        # only the event files are the writer's: a file another process drops in tensorboard/ at
        # this moment stays theirs (never claimed, so --overwrite keeps it)
        self.dir.claim(*(f"tensorboard/{p.name}" for p in sorted(set(folder.iterdir()) - before)
                         if p.name.startswith(EVENTS.split("/", 1)[1])))

    def _board_row(self, step: int, row: dict) -> None:
        if self.board is not None:
            for name, value in row.items():
                if name != "step" and value == value:  # NaN: not measured this step
                    self.board.add_scalar(name, value, step)
