"""The mismatch monitor inside an RL run: minirl's ``Monitor`` (``minirl.training.monitor``), built on
the Tracker's stats mode and the Analyzer.

Why stats mode by default: the monitor runs every ``monitor_every`` steps of a run on the run's own
machine, so it keeps 8 numbers per token and site (``aligntools.tracker.stats``), never a tensor; its
relative errors are the Analyzer's stats-mode lower bounds (a stats comparison can miss an error,
never invent one), read the same way at every step, so their trend is the run's. Where a lower bound
is too loose to show a trend (a deep residual stream's swings ~10x between readings on smollm2-135m:
docs/measurements/2026-11-29-mismatch-growth.md), ``mode="tensor"`` keeps the probe's tensors and
reads the exact errors: 64 probe tokens of a 135M model are ~13 MB a side.

Why a measured noise floor: a bf16 engine differs from an fp32 trainer everywhere; what matters is
where the difference jumps beyond what the trainer's own rounding explains. The first reading
measures that floor once (the trainer's model in float64 against itself, as ``mlab check`` does),
and every reading's first divergence is judged against it.

Routing flips from stats: the top-k expert ids' min, max, mean and L2 do not depend on the ids'
order, and for k <= 4 distinct ids they determine the set (min and max are two ids, the sum and the
sum of squares pin the other two); so a token whose four differ changed its expert set. For k > 4
the count is a lower bound, like every other stats-mode number here.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np
import torch

from aligntools.adapters import adapter_for
from aligntools.analyzer.comparison import compare
from aligntools.analyzer.tolerance import Tolerance
from aligntools.sites import parse, select, sort_sites
from aligntools.tracker.stats import STAT_NAMES
from aligntools.tracker.tracker import capture
from minirl.training.monitor import Reading

if TYPE_CHECKING:
    import xarray as xr

SET_STATS = ("min", "max", "mean", "l2")
"""Stats of an id row that do not depend on the ids' order (``topk_ids`` set flips)."""


class MismatchMonitor:
    """Trainer vs rollout engine on a probe, once per monitor step (``measure``)."""

    def __init__(self, sites: str, mode: str = "stats") -> None:
        if mode not in ("stats", "tensor"):
            raise ValueError(f"monitor mode must be 'stats' or 'tensor'; got {mode!r}")
        self.patterns = [p.strip() for p in sites.split(",") if p.strip()]
        self.mode = mode
        self.tolerance: Tolerance | None = None  # the noise floors, measured by the first reading
        self.sites: list[str] | None = None

    def measure(self, step: int, model: torch.nn.Module, engine: object, probe: torch.Tensor) -> Reading:
        """Capture ``model`` (transformers, the trainer) and ``engine`` (a minirl ``Engine`` or vLLM
        rollouts) on ``probe`` in this monitor's mode and compare them against the noise floor."""
        target = capture_target(engine)
        if self.sites is None:
            self.sites = self._sites(model, target)
        train = capture(model, probe, sites=self.sites, mode=self.mode, progress=False)
        infer = capture(target, probe, sites=self.sites, mode=self.mode, progress=False)
        if self.tolerance is None:
            self.tolerance = self._noise_floor(model, probe, train)
        cmp = compare(train.dataset, infer.dataset, tolerance=self.tolerance, labels=("trainer", "engine"),
                      allow_different_models=True, workers=1)  # a quantized engine's weights differ on purpose
        rel = {s: float(r.summary["rel_l2"]) for s, r in cmp.results.items() if "rel_l2" in r.summary}
        first = cmp.first_divergence
        flips = routing_flips(train.dataset, infer.dataset, cmp.alignment.idx_a, cmp.alignment.idx_b)
        return Reading(step, rel, first.site if first else "", flips)

    def _sites(self, model: torch.nn.Module, target: object) -> list[str]:
        """The sites both sides have among ``patterns``; a pattern neither has (router sites of a dense
        model) is skipped, and none left is an error naming what there is."""
        engine_sites = set(adapter_for(target).available_sites())
        available = [s for s in adapter_for(model).available_sites() if s in engine_sites]
        chosen = [s for p in self.patterns for s in _matches(p, available)]
        if not chosen:
            raise ValueError(f"monitor_sites={','.join(self.patterns)!r} selects no site both the trainer and the "
                             f"engine have; sites here: {', '.join(available)}")
        return list(dict.fromkeys(chosen))

    def _noise_floor(self, model: torch.nn.Module, probe: torch.Tensor, train: object) -> Tolerance:
        """The trainer's own rounding per site: its capture against a float64 copy of itself."""
        ref_model = copy.deepcopy(model).to(torch.float64)
        if getattr(ref_model.config, "_experts_implementation", None) not in (None, "eager"):
            ref_model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel (as mlab check)
        ref = capture(ref_model, probe, sites=self.sites, mode=self.mode, progress=False)
        del ref_model
        own = compare(ref.dataset, train.dataset, labels=("float64", "trainer"), workers=1)
        floors, _ = Tolerance.usable_floors({s: r.summary["rel_l2"] for s, r in own.results.items()
                                             if "rel_l2" in r.summary})
        return Tolerance().with_noise_floor(floors)


def capture_target(engine: object) -> object:
    """What the Tracker captures of a rollout engine: a minirl ``Engine`` itself, the vLLM ``LLM``
    inside minirl's vLLM rollouts (``minirl.vllm.rollouts.VllmRollouts.llm``), the SGLang runner
    inside minirl's SGLang rollouts (``minirl.sglang.rollouts.SglangRollouts.runner``)."""
    if hasattr(engine, "add_tap") and hasattr(engine, "score"):
        return engine
    llm = getattr(engine, "llm", None)
    if type(llm).__module__.split(".")[0] == "vllm":
        return llm
    runner = getattr(engine, "runner", None)
    if type(getattr(runner, "model_runner", None)).__module__.split(".")[0] == "sglang":
        return runner
    raise TypeError(f"the mismatch monitor cannot capture a {type(engine).__qualname__} rollout engine: it captures "
                    f"minirl's Engine, vLLM and SGLang rollouts (engine: minirl..., vllm... or sglang...); "
                    f"set monitor_every: 0")


def routing_flips(a: xr.Dataset, b: xr.Dataset, idx_a: np.ndarray | None = None,
                  idx_b: np.ndarray | None = None) -> dict[int, float]:
    """MoE layer -> share of tokens whose top-k expert set differs, from ``L{i}.topk_ids`` in captures
    ``a`` and ``b`` of one mode (rows paired by ``idx_a``/``idx_b``, an Analyzer alignment; None = in
    order): the sorted ids of tensor captures (exact), the order-free stats of stats captures (exact
    for k <= 4, a lower bound above: module docstring)."""
    cols = [STAT_NAMES.index(s) for s in SET_STATS]
    out = {}
    for site in sort_sites([s for s in a.data_vars if s in b.data_vars and parse(s).kind == "topk_ids"]):
        modes = {"stat" in a[site].dims, "stat" in b[site].dims}
        if len(modes) > 1 or a[site].shape[1:] != b[site].shape[1:]:
            continue  # a stats capture against a tensor one, or another k: not one set to compare
        stats = modes == {True}
        # [tokens, 4] order-free stats, or [tokens, k] ids in ascending order: a set either way
        sa, sb = (a[site].values[:, cols], b[site].values[:, cols]) if stats else (
            np.sort(a[site].values, axis=1), np.sort(b[site].values, axis=1))
        sa, sb = (sa if idx_a is None else sa[idx_a]), (sb if idx_b is None else sb[idx_b])
        out[parse(site).layer] = float(np.mean(np.any(sa != sb, axis=1))) if len(sa) else float("nan")
    return out


def _matches(pattern: str, available: list[str]) -> list[str]:
    try:
        return select(pattern, available)
    except ValueError:  # a pattern this model lacks
        return []
