"""``aligntools.drill``: from a divergent site down to the op inside it."""

from __future__ import annotations

import math
import os

import torch

from aligntools.analyzer.divergence import GROWTH_THRESHOLD
from aligntools.analyzer.tolerance import Tolerance, coarser
from aligntools.drilldown.pairing import analyse, line_up, rel_l2
from aligntools.drilldown.result import DrillResult
from aligntools.drilldown.windows import module_of, record_hf, record_minirl
from aligntools.sites import ROUTING_SITES, parse

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

    _check_arguments(site, tolerance, threshold)  # bad input fails before any model loads
    path = validate_checkpoint(model_path)
    vocab = _check_site(path, site)
    train_spec, infer_spec = parse_train(train), parse_infer(infer, dtype)
    if infer_spec.spec.kind != "minirl":
        raise UsageError(f"drill records transformers and minirl engines, not {infer_spec.spec.kind}'s ops yet; "
                         f"aligntools.fingerprint(capture, model) names the minirl knobs that reproduce it, and "
                         f"infer='minirl:hf_exact,KNOB=VALUE,...' drills those")
    ids = _one_sequence(prepare_tokens(path, DEFAULT_TOKENS, n_seqs=1) if ids is None else ids, vocab)
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


def _check_arguments(site: object, tolerance: object, threshold: object) -> None:
    """The arguments that need no checkpoint: a site the drill opens, a ``Tolerance``, and a
    growth threshold that can fire (finite, > 1: at 1 or below every op would jump, NaN never)."""
    from aligntools.gates.inputs import UsageError

    if not isinstance(site, str):
        raise UsageError(f"site must be a string such as 'L0.attn_out'; got {type(site).__name__} {site!r}")
    try:
        module_of(site)
    except ValueError as e:
        raise UsageError(str(e)) from e
    if tolerance is not None and not isinstance(tolerance, Tolerance):
        raise UsageError(f"tolerance must be a Tolerance (aligntools.Tolerance(), or Tolerance.load(path)); got "
                         f"{type(tolerance).__name__} {tolerance!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
            math.isfinite(threshold) and threshold > 1):
        raise UsageError(f"threshold={threshold!r}: the growth factor an op's error must beat its inputs' by must "
                         f"be a finite number > 1 (default {GROWTH_THRESHOLD:g})")


def _check_site(path: os.PathLike, site: str) -> int:
    """The model has ``site``: its layer exists and, for a router site, is an MoE layer (a dense
    MLP has no router to drill). Returns the vocabulary size, for the ids."""
    from aligntools.gates.inputs import UsageError
    from minirl import model_spec, read_config

    try:
        spec = model_spec(read_config(path))
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from e
    layer, kind = parse(site).layer, parse(site).kind
    if layer >= spec.n_layers:
        raise UsageError(f"{site}: the model has {spec.n_layers} decoder layers (L0 to L{spec.n_layers - 1})")
    if kind in ROUTING_SITES and not spec.is_moe(layer):
        which = (f"MoE layers: {', '.join(f'L{i}' for i in spec.moe_layers)}" if spec.moe_layers else
                 "a dense model: the model has no router sites")
        raise UsageError(f"{site}: layer {layer} has a dense MLP, no router ({which}); drill L{layer}.mlp_out "
                         f"for its MLP")
    return spec.vocab_size


def _one_sequence(ids: object, vocab: int) -> torch.Tensor:
    """[S] or [1, S] integer ids inside the vocabulary -> [1, S] long: the recorder reads layouts
    by one sequence's length. Bool ids are refused like float ones (True would be token 1)."""
    from aligntools.gates.inputs import UsageError

    ids = torch.as_tensor(ids)
    ids = ids[None] if ids.dim() == 1 else ids
    if (ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2 or ids.is_floating_point() or ids.is_complex()
            or ids.dtype == torch.bool):
        raise UsageError(f"drill runs one sequence: ids must be integer token ids [S] or [1, S] with S >= 2; "
                         f"got {ids.dtype} {tuple(ids.shape)}")
    given, ids = ids.dtype, ids.long()
    outside = ids[(ids < 0) | (ids >= vocab)]
    if len(outside):
        narrow = (f" (a {str(given).removeprefix('torch.')} tensor wraps larger ids around, 200 to -56 in int8: "
                  f"give torch.long ids)" if torch.iinfo(given).bits < 32 else "")
        raise UsageError(f"token id {int(outside[0])} is outside the vocabulary (size {vocab}){narrow}")
    return ids
