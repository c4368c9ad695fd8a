"""The per-site mismatch monitor (``aligntools.monitor``) inside another trainer's run, and the run
log it leaves in the records folder.

Why the same monitor as minirl's ``monitor_every``: a TRL run's readings then mean what a minirl
run's mean (the Tracker's stats mode against a measured float64 noise floor, first divergence,
routing flips) and are drawn by the same command. Why a run log beside the records: ``mlab plot
RUN --sites`` reads a minirl run log, ``RUN/metrics.nc`` (``minirl.training.run_log``: one row
per step, readings over ``monitor_step`` x ``site``); writing that file into the records folder
makes the folder the whole evidence of the run, for ``mlab audit`` (its ``step-*.jsonl``) and
``mlab plot --sites`` (its ``metrics.nc``) alike.

Why a fixed probe from the run's own prompts: a trainer run has no held-out problems of minirl's
kind; what the monitor needs is the same tokens at every reading, so that a change between readings
is the weights', not the probe's. The probe is the dataset's first prompts, joined and repeated to
``tokens`` positions, fixed at the first reading.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from aligntools.integrations.stats import PREFIX
from aligntools.monitor import MismatchMonitor
from minirl.training.monitor import DEFAULT_SITES
from minirl.training.run_log import RunLog


class SiteMonitor:
    """Trainer vs the engine that generated, on one probe, at the first generation and then at the
    first generation at least ``every`` steps after the last reading (a generation may span several
    optimizer steps, so the steps read need not be multiples of ``every``). ``log``: the run log's
    path (``records/metrics.nc``), or None to send the readings to the trainer's logger only."""

    def __init__(self, every: int, sites: str = DEFAULT_SITES, mode: str = "stats", log: Path | None = None) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"monitor_every={every!r}: a whole number of steps >= 0 (0: no monitor)")
        self.every = every
        self.watcher = MismatchMonitor(sites=sites, mode=mode)
        self.log = RunLog(log) if log is not None else None
        self.last: int | None = None  # step of the last reading

    def due(self, step: int) -> bool:
        return bool(self.every) and (self.last is None or step >= self.last + self.every)

    def read(self, step: int, model: torch.nn.Module, engine: object, probe: torch.Tensor) -> dict[str, float]:
        """One reading of ``model`` (the trainer's, in eval mode while read: no dropout, nothing drawn
        from torch's RNG) against ``engine`` on ``probe`` [1, S]; kept for the run log's next row and
        returned as scalars for the trainer's logger: ``mismatch/rel_l2/<site>``,
        ``mismatch/routing_flips/L<layer>`` and ``mismatch/monitor_seconds``."""
        start, training = time.perf_counter(), model.training
        model.eval()
        try:
            reading = self.watcher.measure(step, model, engine, probe).to_dict()
        finally:
            model.train(training)
        seconds = time.perf_counter() - start
        self.last = step
        if self.log is not None:
            self.log.read({**reading, "seconds": seconds})
        return {**{f"{PREFIX}/rel_l2/{site}": err for site, err in reading["rel_l2"].items()},
                **{f"{PREFIX}/routing_flips/L{layer}": share for layer, share in reading["routing_flips"].items()},
                f"{PREFIX}/monitor_seconds": seconds}

    def row(self, step: int, stats: dict[str, float]) -> None:
        """The step's ``mismatch/...`` statistics as the run log's row (``mismatch/ratio/mean`` ->
        ``ratio_mean``: netCDF reserves '/'; ``abs_dlogp_mean`` is the name ``mlab plot``'s gap panel
        reads), written with any reading kept since the last row."""
        if self.log is not None:
            self.log.append(step, {k.removeprefix(f"{PREFIX}/").replace("/", "_"): v for k, v in stats.items()})


def probe_of(prompt_ids: list[list[int]], tokens: int) -> torch.Tensor:
    """[1, tokens] ids: ``prompt_ids`` joined and repeated from the start until ``tokens`` long."""
    ids = [t for p in prompt_ids for t in p]
    if not ids:
        raise ValueError("the monitor's probe needs at least one prompt token; the dataset's prompts are empty")
    return torch.tensor([(ids * (tokens // len(ids) + 1))[:tokens]], dtype=torch.int64)
