"""Knob attribution: how much of the train-inference logprob gap each engine knob explains.

Why one-at-a-time *and* cumulative: the single-knob numbers answer "if I fix only this, how
much do I win" (what an engineer chooses by), the cumulative curve answers "what is left
after fixing the top ones" (Ring-linear Fig. 10 shows the mismatch falling as each fix is
added). Knobs interact, so single-knob shares need not sum to 1; both views are reported
with their raw gaps so nothing is hidden behind a normalisation.

Definitions (mean |Δ logprob| over every scored token, inference engine vs training engine):
  G0      gap with ``infer_knobs``
  G_i     gap with only knob i set to its ``Knobs.aligned()`` value
  share_i = max(G0 - G_i, 0) / G0
  cumulative: knobs set to aligned one after another in ranked order; the last value is the
  gap with every knob aligned. The dtype is not a knob: in bf16 that final gap stays well
  above zero and is reported as the row ``residual (dtype)``. Weight quantization is one
  (``weights``, aligned value ``none``): a quantized rollout engine's gap is attributed to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from minirl import Knobs

RESIDUAL = "residual (dtype)"
GapFn = Callable[[dict[str, object]], float]  # knob changes (name -> value) -> mean |Δ logprob|


@dataclass
class Attribution:
    """Result of ``attribute``. ``table`` is indexed by knob (plus the residual row) with
    columns ``infer``, ``aligned`` (knob values), ``gap_alone`` (G_i), ``gain`` (G0 - G_i),
    ``share``, ``gap_cumulative`` and ``share_cumulative``; rows are in ranked order."""

    table: pd.DataFrame
    baseline_gap: float
    residual_gap: float
    dtype: str
    train: str

    @property
    def ranked(self) -> list[str]:
        """Knobs sorted by the share of the gap they explain alone, largest first."""
        return [k for k in self.table.index if k != RESIDUAL]

    def summary(self) -> str:
        """A terminal-friendly table plus one line on the baseline and residual gaps."""
        cols = ["infer", "aligned", "gap_alone", "share", "gap_cumulative"]
        body = self.table[cols].to_string(float_format=lambda v: f"{v:.3g}")
        return (f"knob attribution (infer {self.dtype} vs train {self.train}), baseline mean |Δ logprob| "
                f"{self.baseline_gap:.3g}, all knobs aligned {self.residual_gap:.3g}\n{body}\n{self.share_note()}")

    def share_note(self) -> str:
        """Why the shares do not add up to 100% (readers add the bars and expect it)."""
        total = self.table["share"].sum()
        return (f"The shares add up to {total:.0%}; they need not add up to 100%: each knob's share is measured alone against the "
                "same baseline, and knobs interact (fixing one changes what another contributes); the "
                "residual row is the gap left with every knob aligned.")

    def plot(self):
        """Bar chart of the single-knob shares + the cumulative gap curve (Ring-linear Fig. 10);
        a ``matplotlib.figure.Figure`` (no pyplot state: renders headless, shows inline)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(12, 3.8))
        ax1, ax2 = fig.subplots(1, 2)
        shares = self.table["share"]
        colors = ["#999999" if k == RESIDUAL else "#c0392b" for k in shares.index]
        bars = ax1.barh(range(len(shares)), shares.values, color=colors)
        ax1.bar_label(bars, [f"{v:.0%}" for v in shares.values], padding=2, fontsize=10)
        ax1.set_yticks(range(len(shares)), shares.index)
        ax1.invert_yaxis()
        ax1.set(xlabel="share of mean |Δ logprob| explained, each knob alone", xlim=(0, 1.1),
                title=f"which knob explains the gap: {self.dtype} infer vs train {self.train}")
        steps = ["baseline", *self.ranked]
        gaps = [self.baseline_gap, *self.table.loc[self.ranked, "gap_cumulative"]]
        ax2.plot(range(len(steps)), gaps, marker="o", color="#2c3e50")
        ax2.axhline(self.residual_gap, ls="--", c="gray", label=RESIDUAL)
        ax2.set_xticks(range(len(steps)), [("+" + s if i else s) for i, s in enumerate(steps)],
                       rotation=45, ha="right")
        if min(gaps) > 0:
            ax2.set_yscale("log")
        ax2.set(ylabel="mean |Δ logprob|", title=f"aligning knobs one after another (train {self.train})")
        ax2.legend()
        fig.tight_layout()
        return fig


def run_attribution(gap: GapFn, differing: dict[str, tuple[object, object]], *,
                    progress: bool = True) -> tuple[pd.DataFrame, float, float]:
    """The attribution arithmetic over any gap function (engine-free, so it is testable alone).

    ``differing``: knob -> (infer value, aligned value). ``gap({})`` is the baseline;
    ``gap({k: aligned})`` sets knobs. Returns (table in ranked order, G0, all-aligned gap).
    """
    names = list(differing)
    bar = tqdm(total=1 + 2 * len(names), desc="knob attribution", unit="run", disable=not progress)
    g0 = _step(bar, gap, {})
    alone = {k: _step(bar, gap, {k: differing[k][1]}) for k in names}
    ranked = sorted(names, key=lambda k: alone[k])  # stable: ties keep the Knobs field order
    changes: dict[str, object] = {}
    cumulative = {}
    for k in ranked:
        changes[k] = differing[k][1]
        cumulative[k] = _step(bar, gap, dict(changes))
    bar.close()
    residual = cumulative[ranked[-1]] if ranked else g0
    rows = [{"knob": k, "infer": str(differing[k][0]), "aligned": str(differing[k][1]),
             "gap_alone": alone[k], "gain": g0 - alone[k], "share": _share(g0, alone[k]),
             "gap_cumulative": cumulative[k], "share_cumulative": _share(g0, cumulative[k])} for k in ranked]
    rows.append({"knob": RESIDUAL, "infer": "", "aligned": "", "gap_alone": residual, "gain": np.nan,
                 "share": min(residual / g0, 1.0) if g0 > 0 else 0.0, "gap_cumulative": residual,
                 "share_cumulative": np.nan})
    return pd.DataFrame(rows).set_index("knob"), g0, residual


def _step(bar, gap: GapFn, changes: dict[str, object]) -> float:
    value = float(gap(changes))
    bar.update(1)
    return value


def _share(g0: float, g: float) -> float:
    return max(g0 - g, 0.0) / g0 if g0 > 0 else 0.0


def attribute(model_path: str | os.PathLike, infer_knobs: Knobs | None = None, train: str = "hf", dtype: str = "bfloat16",
              tokens: int | torch.Tensor = 256, knobs: Sequence[str] | None = None,
              progress: bool = True, target: Knobs | None = None) -> Attribution:
    """Share of the final mean |Δ logprob| (minirl vs the training engine) each knob explains.

    ``infer_knobs``: the inference engine's knobs, a ``Knobs`` or a preset name as engine specs
    write it (``"typical"``, ``"aligned"``, ``"hf_exact"``; default ``Knobs.typical_inference()``);
    ``train``: the training engine spec (``hf`` = float32, ``hf:bfloat16``); ``dtype``: the
    inference engine's dtype; ``tokens``: a count of built-in text tokens or token ids [B, S];
    ``knobs``: restrict to these knob names (default: every knob whose value differs from
    ``target``); ``target``: the knob values each knob is toggled to, a ``Knobs`` or a preset
    name (default ``Knobs.aligned()``; use ``"hf_exact"`` against a stock bf16 trainer), with
    the attention backend the training model runs. Only logprobs
    are computed (``Engine.score``), one training pass reused, so a knob evaluation costs one
    inference prefill.
    """
    from minirl import EngineSpec, Knobs, build_engine  # noqa: F811 - lazy: importing aligntools must not import minirl

    from aligntools.gates.inputs import follow_attention, load_hf, parse_train, prepare_tokens, validate_checkpoint

    path = validate_checkpoint(model_path)
    infer_knobs = _knobs_argument("infer_knobs", infer_knobs) or Knobs.typical_inference()
    target = _knobs_argument("target", target)
    if isinstance(knobs, str) or not (knobs is None or isinstance(knobs, Sequence)):
        raise TypeError(f"knobs must be a list of knob names such as ['rmsnorm', 'rope'] (or None: every knob that "
                        f"differs); got {type(knobs).__name__} {knobs!r:.60}")
    ids = prepare_tokens(path, tokens)  # [B, S]
    train_spec = parse_train(train)
    trainer = load_hf(path, train_spec.dtype, **train_spec.options)
    with torch.no_grad():
        logits = trainer(input_ids=ids, use_cache=False).logits  # [B, S, V]
    ref = logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # [B, S-1]
    seqs = ids.tolist()
    # "aligned" means the trainer's own attention backend (Ring-linear 5.2.1: the backend must be
    # consistent), whatever the target preset names: stock transformers runs sdpa, not eager.
    aligned = (Knobs.aligned() if target is None else target).replace(
        **follow_attention(trainer.config._attn_implementation))
    valid = list(infer_knobs.to_dict())
    unknown = sorted(set(knobs or ()) - set(valid))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; valid knobs: {valid}")
    pairs = {k: (getattr(infer_knobs, k), getattr(aligned, k)) for k in valid}
    differing = {k: v for k, v in pairs.items() if (k in knobs if knobs is not None else v[0] != v[1])}

    def gap(changes: dict[str, object]) -> float:
        knobs = infer_knobs.replace(**changes).to_dict()  # every knob as an option: the spec's preset is moot
        engine = build_engine(EngineSpec("minirl", dtype, None, knobs), path)
        lp = torch.stack(engine.score(seqs))  # [B, S-1]
        return float((lp - ref).abs().mean())

    table, g0, residual = run_attribution(gap, differing, progress=progress)
    return Attribution(table, g0, residual, dtype=dtype, train=train)


def _knobs_argument(name: str, value: object) -> Knobs | None:
    """``value`` as Knobs: a Knobs passes, a preset name (``"typical"``) is looked up, None
    stays None; anything else is refused here, before a model loads (a string used to fail
    as "'str' object has no attribute 'to_dict'" after the trainer's forward)."""
    from minirl import EngineSpec, Knobs, engine_kind  # noqa: F811 - lazy, as in attribute()

    if value is None or isinstance(value, Knobs):
        return value
    presets = engine_kind("minirl").presets
    if isinstance(value, str) and value in presets:
        return EngineSpec("minirl", preset=value).knobs()
    raise (ValueError if isinstance(value, str) else TypeError)(
        f"{name}={value!r:.60}: must be a minirl Knobs (e.g. Knobs.typical_inference()) or a preset name, one "
        f"of {', '.join(presets)}")
