"""``aligntools.drill``: from a divergent site down to the op inside it."""

from __future__ import annotations

import os

import torch

from aligntools.analyzer.divergence import GROWTH_THRESHOLD
from aligntools.analyzer.tolerance import Tolerance, coarser
from aligntools.drilldown.pairing import analyse, line_up, rel_l2
from aligntools.drilldown.result import DrillResult
from aligntools.drilldown.windows import module_of, record_hf, record_minirl

DEFAULT_TOKENS = 24
"""One sequence of built-in text: enough rows for every op, cheap to record op by op."""


def drill(model_path: str | os.PathLike, site: str, train: str = "hf", infer: str = "minirl",
          ids: torch.Tensor | None = None, dtype: str | None = None,
          tolerance: Tolerance | None = None, threshold: float = GROWTH_THRESHOLD) -> DrillResult:
    """Re-run ``site``'s module (a layer's attention for q/k/v/attn_out, its MLP or MoE block for
    router_logits/topk_*/mlp_out) in both engines on the same tokens, record every tensor op
    inside it, line the ops up and name the first whose error jumps beyond its inputs'.

    ``train``/``infer``/``dtype``: engine specs as ``check_alignment`` takes them
    (``hf[:DTYPE][,attn=...]``; ``minirl[:PRESET][,knob=value...]``). ``ids``: one sequence
    of token ids, [S] or [1, S] (default: 24 tokens of the built-in text). ``tolerance``: the
    per-site rules (an op's limit is its site's, in the coarser of the two engines' dtypes);
    ``threshold``: the growth factor of the first-divergence rule.
    """
    from aligntools.gates.inputs import (UsageError, load_hf, parse_infer, parse_train, prepare_tokens,
                                         validate_checkpoint)
    from minirl import build_engine

    module_of(site)  # an unsupported site fails before any model loads
    path = validate_checkpoint(model_path)
    train_spec, infer_spec = parse_train(train), parse_infer(infer, dtype)
    if infer_spec.spec.kind != "minirl":
        raise UsageError(f"drill records transformers and minirl engines, not {infer_spec.spec.kind}'s ops yet; "
                         f"aligntools.fingerprint(capture, model) names the minirl knobs that reproduce it, and "
                         f"infer='minirl:hf_exact,KNOB=VALUE,...' drills those")
    ids = _one_sequence(prepare_tokens(path, DEFAULT_TOKENS, n_seqs=1) if ids is None else ids)
    model = load_hf(path, train_spec.dtype, **train_spec.options)
    engine = build_engine(infer_spec.following(model.config._attn_implementation).built, path)
    rec_a, rec_b = record_hf(model, ids, site), record_minirl(engine, ids, site)
    for rec, side in ((rec_a, train), (rec_b, infer)):
        if not rec.ops:
            raise RuntimeError(f"drill recorded no op of {site} in {side}: its module never ran on the input")
    limit = (tolerance or Tolerance()).limit(site, coarser(train_spec.dtype, infer_spec.spec.dtype))
    input_error = rel_l2(rec_a.input, rec_b.input)
    table, first = analyse(line_up(rec_a.ops, rec_b.ops), input_error, limit, threshold)
    return DrillResult(site, str(train_spec), infer_spec.label, table, first, input_error)


def _one_sequence(ids: torch.Tensor) -> torch.Tensor:
    """[S] or [1, S] integer ids -> [1, S]: the recorder reads layouts by one sequence's length."""
    from aligntools.gates.inputs import UsageError

    ids = torch.as_tensor(ids)
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2 or ids.is_floating_point():
        raise UsageError(f"drill runs one sequence: ids must be integer token ids [S] or [1, S] with S >= 2; "
                         f"got {ids.dtype} {tuple(ids.shape)}")
    return ids.long()
