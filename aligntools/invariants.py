"""What the lab assumes about a model's sites, proved before any verdict (the capture's side).

Why: the capture adapters and the engines' site maps read a family through its
``minirl.families`` entry, and a family without one is read as the Llama shape. A wrong reading is
silent: a vLLM layer that returns the residual sum read as a delta gives a false MISALIGNED while
the log-probs agree; BLOOM's embedding read before its ``word_embeddings_layernorm`` is another
tensor than what its first layer receives. So, on the gate's own tokens, each reading is checked
against what the model's forward computes, and a miss is a refusal that names the family, the
invariant and its size, never a verdict (docs/models.md, "Invariants"). The result types and the
trainer's invariants live in ``minirl.invariants`` (the trainer may not import aligntools) and are
re-exported here.

On the transformers model (``prove_model``): ``trainer_logprobs`` (``minirl.invariants``), then
  * ``logits_site``: the captured ``logits`` equal ``model(ids).logits``;
  * ``embed_site``: the captured ``embed`` equals what the first layer receives;
  * ``final_chain``: the last ``resid_post`` through the final norm and ``lm_head`` (and the
    family's logits transform) gives the ``logits``.
On an engine's capture of the same tokens (``prove_capture``), ``engine_final_norm``: its last
``resid_post`` through the transformers model's own final norm gives its ``final_norm`` site, which
an engine whose layer outputs are misread fails. After the comparison (``prove_reading``),
``site_reading``: no site far off while the final log-probs agree.
"""

from __future__ import annotations

import math
import warnings

import torch

from minirl.invariants import (  # noqa: F401 - the result types and the trainer's invariants, re-exported
    Check, InvariantError, Proof, limits, probe_forward, probe_ids, proof_of, prove_sync, prove_trainer, trainer_check)

#: A site further off the training engine than this (rel. L2) while the final log-probs agree is
#: misread, not computed differently: numeric error grows down the layers into the logits, while a
#: misreading (a residual sum read as a delta) stays in its site. bf16 sites sit near 1e-2.
MISREAD_REL_L2 = 0.25

def prove_model(model: torch.nn.Module, capture: object | None = None,
                ids: torch.Tensor | None = None) -> Proof:
    """Check every invariant of the transformers ``model`` on ``ids`` (default ``probe_ids``),
    with ``capture`` its capture of those ids (taken here when None). Raises nothing: call
    ``.require()`` to refuse."""
    from aligntools.tracker.tracker import capture as take

    ids, out = probe_forward(model, ids, hidden=True)
    logits, rel = out.logits.double(), limits(next(model.parameters()).dtype)[1]  # [B, S, V]
    with warnings.catch_warnings():  # the capture's "no entry, unproved" warning: this is the proof
        warnings.filterwarnings("ignore", message=".*no `Family` entry")
        cap = take(model, ids, progress=False) if capture is None else capture
    checks = [trainer_check(model, ids, logits),
              _site_check("logits_site", cap, "logits", logits, rel),
              _site_check("embed_site", cap, "embed", out.hidden_states[0].double(), rel),
              _chain("final_chain", cap, model, logits, rel, head=True)]
    return proof_of(model, checks)


def prove_capture(capture: object, model: torch.nn.Module, where: str) -> Proof:
    """``engine_final_norm`` on an engine's ``capture`` of some ids: its last ``resid_post``
    through the transformers ``model``'s own final norm (same weights) must give its own
    ``final_norm`` site. A misread layer output (a residual sum read as a delta) fails it (0.06 on
    the tiny Llama, the norm normalising the doubled scale away); ``lm_head`` stays out, since an
    engine may quantize it. The limit is the 16-bit one whatever the capture's dtype: an engine
    may compute its norm in bf16 even in an fp32 run (``rmsnorm=bf16_compute``: 4e-3), a numeric
    choice the gate is there to find, not a misreading."""
    rel = limits(torch.bfloat16)[1]
    want = _site(capture, "final_norm")
    check = _chain("engine_final_norm", capture, model, want, rel, head=False) if want is not None else \
        Check("engine_final_norm", math.nan, rel, "rel. L2", unproved="the capture has no `final_norm` site")
    return proof_of(model, [check], where)


def prove_reading(model: torch.nn.Module, rel_l2: dict[str, float], logprobs_agree: bool, where: str) -> Proof:
    """``site_reading`` on a gate's comparison: ``rel_l2`` per compared site; refused where a
    site exceeds ``MISREAD_REL_L2`` while ``logprobs_agree`` (the gate's final log-prob check passed)."""
    off = {s: v for s, v in rel_l2.items() if v > MISREAD_REL_L2} if logprobs_agree else {}
    worst = max(off, key=off.get, default=None)
    miss = off[worst] if worst else max(rel_l2.values(), default=0.0) if logprobs_agree else 0.0
    check = Check("site_reading", miss, MISREAD_REL_L2, "rel. L2",
                  detail=f"the lab reads {', '.join(off)} wrongly on this engine" if worst else None)
    return proof_of(model, [check], where)


def _chain(name: str, cap: object, model: torch.nn.Module, want: torch.Tensor, rel: float, head: bool) -> Check:
    """rel. L2 of final_norm(last resid_post) (then, with ``head``, through ``lm_head`` and the
    family's logits transform) against ``want`` [B, S, D], with ``model``'s own modules."""
    from aligntools.adapters.roles import find_roles
    from minirl.families import logits_transform

    roles = find_roles(model, model.config)
    last = max((s for s in cap.sites if s.endswith(".resid_post")), key=lambda s: int(s[1:s.index(".")]),
               default=None)
    lacking = ("the capture has no `resid_post` site" if last is None
               else "no final norm module found" if roles is None or roles.final_norm is None
               else "no `lm_head` found" if head and roles.lm_head is None else None)
    if lacking:  # nothing to prove it with: no pass
        return Check(name, math.nan, rel, "rel. L2", unproved=lacking)
    with torch.no_grad():
        out = roles.final_norm(_site(cap, last).to(next(model.parameters()).dtype))  # [B, S, H]
        if head:
            out = logits_transform(model.config).apply(roles.lm_head(out))  # [B, S, V]
    return Check(name, _rel_l2(out.double(), want), rel, "rel. L2")


def _site_check(name: str, cap: object, site: str, want: torch.Tensor, rel: float) -> Check:
    got = _site(cap, site)
    if got is None:
        return Check(name, math.nan, rel, "rel. L2", unproved=f"the capture has no `{site}` site")
    return Check(name, _rel_l2(got, want), rel, "rel. L2")


def _site(cap: object, name: str) -> torch.Tensor | None:
    """A prefill site as [B, S, D] float64, rows ordered by (request, position); None if absent."""
    if name not in cap:
        return None
    arr = cap[name]
    ds = cap.dataset
    keep = (ds["step"].values == 0) if "step" in ds else slice(None)
    request, position = ds["request"].values[keep], ds["position"].values[keep]
    values = torch.from_numpy(arr.values[keep]).double()
    order = torch.from_numpy((request * (position.max() + 1) + position).argsort(kind="stable"))
    rows = int(request.max()) + 1
    return values[order].reshape(rows, -1, values.shape[-1])


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over the entries where ``b`` (the model's own value) is finite; entries
    both sides compute as NaN/inf count as equal (the model computes no number there, and the gate
    reports it), one side only makes the result NaN (no pass)."""
    if a.shape != b.shape:
        return math.nan
    both = ~torch.isfinite(a) & ~torch.isfinite(b)
    diff = torch.where(both, 0.0, a - b)
    return float(diff.norm() / torch.where(torch.isfinite(b), b, 0.0).norm().clamp_min(1e-30))
