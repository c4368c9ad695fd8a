"""The mismatch monitor's door: where a run hands its trainer and its rollout engine to a monitor.

Why a door and not the monitor itself: measuring which site makes the engine disagree with the
trainer is aligntools' job (Tracker stats mode + Analyzer), and minirl must never import
aligntools (docs/architecture.md). So minirl defines what a monitor is (``Monitor``), when it runs
and where its readings go (``minirl.training.lifecycle``, ``minirl.training.run_log``), and finds the
implementation by its import path, ``PROVIDER``, only when ``monitor_every > 0``. aligntools
implements it in ``aligntools.monitor``; a run without aligntools installed is refused at
config-check time, before any model loads.

Every ``monitor_every`` steps, and at the run's first step, after the weight sync (the engine serves
exactly the trainer's weights, no rollout in flight), the monitor runs both on one fixed probe
(``probe``: held-out problems, the same tokens on both sides) and returns a ``Reading``. It runs
where the engine that made the rollouts lives: in this process (sync, async), or in the first Ray
rollout actor, which receives the trainer actor's model (``minirl.scale_out.ray_actors``).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch loads with the trainer, not with the config
    import torch

PROVIDER = "aligntools.monitor:MismatchMonitor"
"""``module:Class`` of the monitor, built as ``Class(sites=..., mode=...)``: aligntools' Tracker + Analyzer."""

DEFAULT_SITES = "L*.attn_out,L*.mlp_out,L*.resid_post,L*.router_logits,L*.topk_ids"
"""Each layer's attention, MLP and residual outputs, and on MoE layers the router logits and the
top-k expert ids (routing flips); patterns a dense model lacks are skipped."""


@dataclass
class Reading:
    """One monitor step: engine vs trainer on the probe. ``rel_l2``: site -> relative L2 error (a
    stats-mode lower bound, execution order); ``first_divergence``: the first site whose error jumps
    above its inputs' and the noise floor ('' for none); ``routing_flips``: MoE layer -> share of
    probe tokens whose top-k expert set differs."""

    step: int
    rel_l2: dict[str, float]
    first_divergence: str = ""
    routing_flips: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (checkpoint ``state.json``): layer keys become strings."""
        return {"step": self.step, "rel_l2": self.rel_l2, "first_divergence": self.first_divergence,
                "routing_flips": {str(k): v for k, v in self.routing_flips.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Reading:
        return cls(int(d["step"]), {str(k): float(v) for k, v in d["rel_l2"].items()}, str(d["first_divergence"]),
                   {int(k): float(v) for k, v in d["routing_flips"].items()})


class Monitor(Protocol):
    """What ``PROVIDER`` names: built once per run, ``measure`` called at every monitor step."""

    def measure(self, step: int, model: torch.nn.Module, engine: object, probe: torch.Tensor) -> Reading:
        """Run the trainer's ``model`` and the rollout ``engine`` (the object that generated the
        rollouts) on ``probe`` [B, S] token ids and compare them."""


def check(config: object) -> None:
    """Refuse, before any model loads, a monitor this run could not have: one that needs aligntools
    where it is not importable, an engine the Tracker has no adapter for (a plugin's), or no held-out
    problems for its probe."""
    if not getattr(config, "monitor_every", 0):
        return
    module = PROVIDER.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        found = False
    if not found:
        raise ValueError(f"monitor_every={config.monitor_every} needs {module} (the mismatch monitor lives in "
                         f"aligntools, which is not importable here); install aligntools (pip install -e . in the "
                         f"mlab checkout), or set monitor_every: 0")
    kind = str(config.engine).strip().split(",")[0].partition(":")[0].strip()
    if kind not in ("minirl", "vllm", "sglang"):
        raise ValueError(f"monitor_every={config.monitor_every} with engine: {kind}: the monitor captures minirl's "
                         f"engine, vLLM and SGLang, not a plugin's; use engine: minirl..., vllm... or sglang..., "
                         f"or set monitor_every: 0")
    if config.n_eval < 1:
        raise ValueError(f"monitor_every={config.monitor_every} with n_eval=0: the monitor's probe is held-out "
                         f"problems, never trained on; set n_eval >= 1")


def load(sites: str, mode: str = "stats") -> Monitor:
    """The monitor ``PROVIDER`` names, watching ``sites`` in capture ``mode`` (``stats``: per-token
    summaries, lower-bound errors; ``tensor``: the probe's tensors, exact errors)."""
    module, _, name = PROVIDER.partition(":")
    return getattr(importlib.import_module(module), name)(sites=sites, mode=mode)


def probe(trainer: object, n_tokens: int) -> torch.Tensor:
    """The probe of ``trainer``'s run (a ``Trainer``: its tokenizer, held-out set and model),
    refused by name when the model cannot take ``n_tokens`` positions in one sequence."""
    limit = getattr(trainer.model.config, "max_position_embeddings", None)
    if limit is not None and n_tokens > limit:
        raise ValueError(f"monitor_tokens={n_tokens}: the probe is one sequence, and this model "
                         f"takes at most {limit} positions; set monitor_tokens <= {limit}")
    return probe_ids(trainer.tokenizer, trainer.eval_set, n_tokens)


def probe_ids(tokenizer: object, problems: list, n_tokens: int) -> torch.Tensor:
    """[1, n_tokens] token ids of held-out ``problems`` (prompt and answer, as SFT formats them)
    joined into one row, repeated from the start if they are short: the same tokens at every monitor
    step, never trained on, so a change between steps is the weights', not the probe's."""
    import torch

    from minirl.training.sft import encode

    ids: list[int] = []
    for problem in problems:
        prompt, answer = encode(tokenizer, problem.prompt, problem.answer)
        ids += prompt + answer
        if len(ids) >= n_tokens:
            break
    while len(ids) < n_tokens:
        ids += ids
    return torch.tensor([ids[:n_tokens]], dtype=torch.int64)
