"""What the lab assumes about a model, proved on the model before a run (the trainer's side).

Why: every reader in the lab (the RL trainer's fused log-prob path, the capture adapters, the
engines' site maps) reads a family through its ``minirl.families`` entry, and a family without
one is read as the Llama shape. A wrong reading is silent: Falcon-H1's ``lm_head_multiplier``
ignored gives an RL run whose trainer log-probs are 0.9 nats off the model's; a weight sync that
loses gpt_oss's experts scores every step after the first with another model. So, on a short
probe batch, each reading is checked against what the model itself computes, and a miss is a
refusal that names the family, the invariant and its size, never a run (docs/models.md,
"Invariants"). This module holds the result types and the trainer's invariants
(``prove_trainer``, ``prove_sync``); ``aligntools.invariants`` adds the capture's.

Limits: a real reading error moves these by whole nats or by a relative L2 near 1; correct
readings differ by rounding only (fp32: ~1e-6). The limits sit between, scaled to the dtype the
tensors were computed in (``limits``). Cost: one forward of 2 x 12 tokens (docs/measurements).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

#: The probe batch: [rows, tokens] of ids drawn with a fixed seed from the model's vocabulary.
PROBE_SHAPE = (2, 12)

#: Each invariant's subject and how it fails, for the refusal message.
STATEMENTS = {
    "trainer_logprobs": ("the trainer's log-probs", "differ from the model's own forward"),
    "logits_site": ("the captured `logits` site", "differs from the model's own logits"),
    "embed_site": ("the captured `embed` site", "differs from what the model's first layer receives"),
    "final_chain": ("the last `resid_post` through the final norm and `lm_head`", "does not give the `logits` site"),
    "engine_final_norm": ("the engine's last `resid_post` through the final norm", "differs from its `final_norm` site"),
    "sync_exact": ("the engine's log-probs", "move across a weight sync of the weights it already serves"),
    "site_reading": ("the worst compared site", "is off the training engine while the final log-probs agree"),
}

#: Config fields that scale the embedding or the logits outside their modules (what the lab's readers
#: apply themselves; scales inside a layer are the modules' own): a refusal names those set off 1
#: that the family's entry does not read.
SCALE_FIELD = re.compile(r"^(final_)?(logit|lm_head|embedding|output)\w*(mult|scal|softcap)")


@dataclass(frozen=True)
class Check:
    """One invariant's outcome: ``miss`` (in ``unit``) against ``limit``; NaN never holds."""

    name: str
    miss: float
    limit: float
    unit: str  # "nats" (max |Δ log p|) or "rel. L2"
    unproved: str | None = None  # why nothing could be measured (a site the capture lacks, a crash)
    detail: str | None = None  # what the miss points at (the sites misread)

    @property
    def holds(self) -> bool:
        return self.miss <= self.limit  # False for NaN

    def __str__(self) -> str:
        subject, failure = STATEMENTS[self.name]
        if self.unproved:
            return f"{subject}: not proved ({self.unproved})"
        text = f"{subject} {failure} by {self.miss:.3g} {self.unit} (limit {self.limit:.0e})"
        return f"{text}: {self.detail}" if self.detail else text


class InvariantError(ValueError):
    """A model the lab cannot read right: refused, with the invariant that failed and its size."""


@dataclass
class Proof:
    """The invariants checked on one model (and engine, where ``where`` names one)."""

    model_type: str
    has_entry: bool
    checks: list[Check] = field(default_factory=list)
    where: str = "transformers"
    unread: list[str] = field(default_factory=list)  # scale fields set off 1 that no entry reads

    @property
    def holds(self) -> bool:
        return bool(self.checks) and all(c.holds for c in self.checks)

    def line(self) -> str:
        """One line for the log: which family, whether it has an entry, what held."""
        entry = "entry" if self.has_entry else "no entry"
        worst = ", ".join(f"{c.name} {c.miss:.1e} {c.unit}" for c in self.checks)
        state = "invariants hold" if self.holds else "INVARIANTS FAIL"
        return f"family {self.model_type or '?'} ({entry}, on {self.where}): {state} ({worst})"

    def require(self, names: tuple[str, ...] | None = None) -> "Proof":
        """``self`` when every invariant (of ``names``, default all) holds, else raise the refusal.
        The trainer needs ``trainer_logprobs`` only; a verdict needs them all."""
        failed = [c for c in self.checks if not c.holds and (names is None or c.name in names)]
        if not failed:
            return self
        why = "; ".join(str(c) for c in failed)
        if self.unread:
            cause = (f"its config sets {', '.join(self.unread)}, which no `Family` entry reads"
                     if not self.has_entry else f"its entry does not read {', '.join(self.unread)}")
        elif not self.has_entry:
            cause = "it has no `Family` entry, and the Llama-shaped default does not fit it"
        else:
            cause = "its `Family` entry does not describe what this checkpoint computes"
        raise InvariantError(f"{self.model_type or 'this model'} on {self.where}: {why}; {cause}. The lab refuses "
                             f"to give a verdict or run on a model it reads wrongly: add or fix its entry in "
                             f"minirl/families.py (docs/models.md)")


def limits(dtype: torch.dtype) -> tuple[float, float]:
    """(nats, rel. L2) limits for tensors computed in ``dtype``: 1e-3 / 1e-4 in fp32 and fp64
    (rounding gives ~1e-6), 0.1 / 2e-2 in 16-bit (a bf16 step is 2^-8 = 3.9e-3 of a value; a
    correct bf16 engine's final norm sits near 3e-3)."""
    return (1e-3, 1e-4) if dtype in (torch.float32, torch.float64) else (1e-1, 2e-2)


def probe_ids(vocab_size: int) -> torch.Tensor:
    """The probe batch [2, 12]: fixed-seed ids, clear of the first special-token ids."""
    low = 3 if vocab_size > 8 else 0
    return torch.randint(low, vocab_size, PROBE_SHAPE, generator=torch.Generator().manual_seed(0))


def prove_trainer(model: torch.nn.Module) -> Proof:
    """``trainer_logprobs`` alone on the probe batch, logged, and refused on a miss: what the RL
    trainer runs on the model it loads (no capture: its run reads no sites). A checkpoint proved
    once in this process under the same family entry is not probed again (a sweep, a test suite)."""
    key = _checkpoint_key(model)
    proof = _PROVEN.get(key) if key else None
    if proof is None:
        ids, out = probe_forward(model, None)
        proof = proof_of(model, [trainer_check(model, ids, out.logits.double())])
        (log.info if proof.has_entry else log.warning)("%s", proof.line())
        if key and proof.holds:
            _PROVEN[key] = proof
    return proof.require()


def prove_sync(engine: object, model: torch.nn.Module) -> Proof | None:
    """``sync_exact`` for a rollout engine that can measure it (``engine.sync_drift``: real vLLM):
    its log-probs on the probe batch must not move across a weight sync of ``model``, whose
    weights it already serves. A sync that moves them corrupts every RL step after the first (it
    moved gpt_oss's by 1.2 nats). None for an engine without the measurement."""
    drift = getattr(engine, "sync_drift", None)
    if not callable(drift):
        return None
    miss = float(drift(model, probe_ids(model.config.get_text_config().vocab_size)))
    proof = proof_of(model, [Check("sync_exact", miss, 0.0, "nats")], where=type(engine).__name__)
    log.info("%s", proof.line())
    return proof.require()


#: Proofs that held, by ``_checkpoint_key``.
_PROVEN: dict[tuple, Proof] = {}


def _checkpoint_key(model: torch.nn.Module) -> tuple | None:
    """(path, its files' sizes and mtimes, dtype, the family entry) of a model loaded from a local
    checkpoint; None for anything else (a model built in memory is always probed)."""
    from pathlib import Path

    from minirl.families import family

    path = Path(str(getattr(model.config, "_name_or_path", "") or "-"))
    if not path.is_dir():
        return None
    files = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                  for f in sorted([*path.glob("*.safetensors"), *path.glob("config.json")]))
    return (str(path.resolve()), files, str(next(model.parameters()).dtype), family(model.config))


def probe_forward(model: torch.nn.Module, ids: torch.Tensor | None, hidden: bool = False
                  ) -> tuple[torch.Tensor, object]:
    """(ids [B, S] on the model's device, the model's own forward; ``hidden``: with its hidden
    states, which transformers records through hooks that leave the model unpicklable (a Ray
    learner ships it), so only the gate, whose model stays in process, asks for them)."""
    param = next(model.parameters())
    ids = probe_ids(model.config.get_text_config().vocab_size) if ids is None else ids
    ids = ids.to(param.device)
    with torch.no_grad():
        return ids, model(ids, output_hidden_states=hidden)


def trainer_check(model: torch.nn.Module, ids: torch.Tensor, logits: torch.Tensor) -> Check:
    """Max |Δ| between the trainer's fused log-probs and ``log_softmax(logits)`` at ``ids``."""
    from minirl.training.trainer_forward import trainer_logprobs

    nats = limits(next(model.parameters()).dtype)[0]
    ref = torch.log_softmax(logits, -1)[:, :-1].gather(2, ids[:, 1:, None])[..., 0].cpu()  # [B, S-1]
    try:
        got = torch.stack(trainer_logprobs(model, ids.tolist())).double()  # [B, S-1]
    except Exception as exc:  # noqa: BLE001 - any failure of the trainer's path on this model is the finding
        return Check("trainer_logprobs", math.nan, nats, "nats", unproved=f"it raises {type(exc).__name__}: {exc}")
    return Check("trainer_logprobs", _max_abs(got, ref), nats, "nats")


def proof_of(model: torch.nn.Module, checks: list[Check], where: str = "transformers") -> Proof:
    from minirl.families import has_entry

    return Proof(model.config.model_type, has_entry(model.config), checks, where=where,
                 unread=_unread_scales(model.config))


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| where ``b`` (the model's own value) is finite; where both are NaN/inf the model
    itself computes no number, so there is nothing to misread (the gate reports the NaN)."""
    if a.shape != b.shape:
        return math.nan
    d = torch.where(~torch.isfinite(a) & ~torch.isfinite(b), 0.0, (a - b).abs())  # NaN: one side only
    return float(d.max())


def _unread_scales(config: object) -> list[str]:
    """``key=value`` for each scale-like config field set off 1 that the family's entry reads not."""
    from minirl.families import family

    fam = family(config)
    read = {fam.embed_scale_attr, fam.logits_multiply_attr, fam.logits_divide_attr, fam.softcap_attr}
    text = config.get_text_config().to_dict()
    return [f"`{k}` = {v}" for k, v in sorted(text.items())
            if SCALE_FIELD.match(k) and k not in read and isinstance(v, (int, float))
            and not isinstance(v, bool) and v not in (0, 1)]
