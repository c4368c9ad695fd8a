"""Line two engines' ops up and find the first one whose error jumps beyond its inputs'.

Pairing: the two op lists are aligned as sequences (``difflib``) on each op's key - role,
family, token-major output shape - so a fused qkv GEMM facing three projections, or RoPE on
q and k together facing RoPE on each, stays *unpaired* instead of being compared with the
wrong tensor. Each paired op gets

    error        relative L2 of its outputs (the Analyzer's metric)
    input_error  relative L2 of its activation inputs, each compared before its cast
                 (``record.Arg``); where no input can be compared, the upstream error
    upstream     the error of the nearest *paired* ops (or the module input) its inputs come
                 from, walking through unpaired ops

and the first divergence rule of ``aligntools.analyzer.divergence.jumps``, one level down:
an op jumps when ``error`` beats its limit and ``threshold`` x ``input_error``. When instead
``input_error`` jumps over ``upstream``, the error entered in the unpaired ops between: those
are named (e.g. RoPE computed on q and k together).

A non-finite output (NaN or +inf, on either side, paired or not) is a divergence of its own:
the relative L2 leaves such elements out (NaN against NaN is "equal"), so a NaN weight read by
both engines would otherwise compare clean. Its error is inf and the earliest such op is the
first divergence unless an op jumped before it. -inf alone is not counted: attention masks fill
scores with it on one side and ``finfo.min`` on the other; an overflow to -inf turns into NaN
one op later (softmax, SiLU) and is named there.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from aligntools.analyzer.divergence import GROWTH_THRESHOLD, jumps
from aligntools.analyzer.metrics import aggregate, derive, row_sums
from aligntools.drilldown.record import MODULE_INPUT, Op
from aligntools.drilldown.roles import knob_for

COLUMNS = ["op", "role", "shape_train", "shape_infer", "dtype_train", "dtype_infer", "error", "input_error",
           "growth", "limit", "jumps", "knob"]


@dataclass(frozen=True)
class OpDivergence:
    """The first op (or run of unpaired ops) whose error is not explained by its inputs'."""

    op: str
    role: str
    error: float
    input_error: float
    limit: float
    knob: str
    row: int
    unpaired: bool
    nonfinite: tuple[int | None, int | None] | None = None
    """NaN/+inf elements of the op's output (train, infer; None: not run on that side), when that
    is why it is named; ``fed_finite``: whether its inputs were all finite (else they came in so)."""
    fed_finite: bool = True

    @property
    def factor(self) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.float64(self.error) / np.float64(self.input_error))

    def __str__(self) -> str:
        knob = f"; knob: {self.knob}" if self.knob else "; no minirl knob sets it"
        if self.nonfinite is not None:
            came = ("from finite inputs" if self.fed_finite else
                    "its inputs were already non-finite (from the module input or an op not recorded)")
            counts = ", ".join(f"{'not run' if n is None else n} in {side}"
                               for n, side in zip(self.nonfinite, ("train", "infer")))
            return f"first non-finite op {self.op} ({self.role}): NaN/inf output elements {counts}, {came}{knob}"
        where = "unpaired ops " if self.unpaired else "op "
        jump = "from clean inputs" if self.input_error == 0 else f"x{self.factor:.3g} its inputs' error"
        return (f"first divergent {where}{self.op} ({self.role}): relative L2 {self.error:.3g} > limit "
                f"{self.limit:.3g}, {jump} ({self.input_error:.3g}){knob}")


MASK_VALUE = 1e30
"""Attention masks fill scores with ``finfo.min`` or -inf; such an element, identical on both
sides, is left out of an error: it would swamp the norm (a masked score add read 1e-41)."""


def rel_l2(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """‖b − a‖ / ‖a‖ in float64 (``aligntools.analyzer.metrics``), mask fill values left out;
    NaN where shapes differ."""
    if a is None or b is None or a.shape != b.shape:
        return float("nan")
    a, b = a.detach().double(), b.detach().double()
    masked = (a == b) & ~(a.abs() < MASK_VALUE)
    a, b = a.masked_fill(masked, 0.0), b.masked_fill(masked, 0.0)
    rows = lambda t: t.reshape(max(len(t), 1) if t.dim() else 1, -1).numpy()  # noqa: E731
    return float(derive(aggregate(row_sums(rows(a), rows(b))))["rel_l2"])


def nonfinite(t: torch.Tensor) -> int:
    """NaN and +inf elements of ``t`` (-inf is a mask fill value, see the module docstring)."""
    if not t.is_floating_point():
        return 0
    return int((t.isnan() | (t == float("inf"))).sum())


def line_up(ops_a: list[Op], ops_b: list[Op]) -> list[tuple[Op | None, Op | None]]:
    """Rows in execution order: (a, b) pairs, and (a, None) / (None, b) for unpaired ops."""
    m = difflib.SequenceMatcher(None, [o.key for o in ops_a], [o.key for o in ops_b], autojunk=False)
    rows: list[tuple[Op | None, Op | None]] = []
    for tag, i1, i2, j1, j2 in m.get_opcodes():
        if tag == "equal":
            rows += list(zip(ops_a[i1:i2], ops_b[j1:j2]))
        else:
            rows += [(a, None) for a in ops_a[i1:i2]] + [(None, b) for b in ops_b[j1:j2]]
    return rows


def analyse(rows: list[tuple[Op | None, Op | None]], input_error: float, limit: float,
            threshold: float = GROWTH_THRESHOLD) -> tuple[pd.DataFrame, OpDivergence | None]:
    """The drill table (``COLUMNS``, one row per entry of ``rows``) and the first divergence
    (None: no op jumps). ``input_error``: the module input's error; ``limit``: the site's."""
    errors = {id(o): rel_l2(a.out, b.out) for a, b in rows if a and b for o in (a, b)}
    by_index = [{o.index: o for o in side if o} for side in zip(*rows)] if rows else [{}, {}]
    row_of = {id(o): n for n, pair in enumerate(rows) for o in pair if o}
    table = [_row(a, b, limit) for a, b in rows]
    clean: set[int] = set()  # unpaired ops upstream of a clean value: not where an error entered
    first: OpDivergence | None = None
    for n, (a, b) in enumerate(rows):
        blown = (a and nonfinite(a.out), b and nonfinite(b.out))  # None: not run on that side
        if any(blown):  # a finding of its own, whatever the finite elements' error says
            table[n].update(error=np.inf, growth=np.inf)
            if first is None:
                table[n]["jumps"] = True
                fed = not any(nonfinite(x.value) for op in (a, b) if op for x in op.args)
                first = OpDivergence(_name(a, b), (a or b).role, np.inf, np.nan, limit, table[n]["knob"], n,
                                     not (a and b), blown, fed)
            continue
        if not (a and b):
            continue
        walk = lambda args: [_upstream(srcs, ops, errors, input_error)  # noqa: E731
                             for op, ops in zip((a, b), by_index) for k, srcs in enumerate(op.arg_sources) if k in args]
        every = range(len(a.arg_sources))
        upstream = max((w[0] for w in walk(every)), default=input_error)
        direct = [rel_l2(*x.compared_with(y)) for x, y in zip(a.args, b.args)]
        inputs, error = max((d for d in direct if np.isfinite(d)), default=upstream), errors[id(a)]
        table[n].update(error=error, input_error=inputs, growth=_ratio(error, inputs))
        dirty = {k for k, d in enumerate(direct) if np.isfinite(d) and jumps(d, upstream, limit, threshold)}
        clean |= {id(o) for w in walk(set(every) - dirty) for o in w[1]}
        if first is None and dirty:
            gap = sorted({id(o): o for w in walk(dirty) for o in w[1] if id(o) not in clean}.values(),
                         key=lambda o: row_of[id(o)])
            for o in gap:
                table[row_of[id(o)]].update(error=inputs, input_error=upstream, growth=_ratio(inputs, upstream),
                                            jumps=True)
            first = _named(gap, inputs, upstream, limit, row_of)
        elif first is None and jumps(error, inputs, limit, threshold):
            table[n]["jumps"] = True
            first = OpDivergence(_name(a, b), a.role, error, inputs, limit, table[n]["knob"], n, False)
        if error <= limit:
            clean |= {id(o) for w in walk(every) for o in w[1]}
    return pd.DataFrame(table, columns=COLUMNS), first


def _named(gap: list[Op], error: float, upstream: float, limit: float, row_of: dict[int, int]) -> OpDivergence:
    """The run of unpaired ops where the error entered, named by their roles and knobs."""
    roles = list(dict.fromkeys(o.role for o in gap)) or ["unknown"]
    names = list(dict.fromkeys(o.family for o in gap))
    knobs = list(dict.fromkeys(k for o in gap for k in knob_for(o.role, o.family).split(", ") if k))
    return OpDivergence(" + ".join(names) or "(no op recorded)", "/".join(roles), error, upstream, limit,
                        ", ".join(knobs), min((row_of[id(o)] for o in gap), default=-1), True)


def _row(a: Op | None, b: Op | None, limit: float) -> dict:
    op = a or b
    return {"op": _name(a, b), "role": op.role, "shape_train": _shape(a), "shape_infer": _shape(b),
            "dtype_train": a.dtype if a else "", "dtype_infer": b.dtype if b else "", "error": np.nan,
            "input_error": np.nan, "growth": np.nan, "limit": limit, "jumps": False,
            "knob": knob_for(op.role, op.family)}


def _name(a: Op | None, b: Op | None) -> str:
    return " | ".join(dict.fromkeys(o.family for o in (a, b) if o))


def _shape(op: Op | None) -> str:
    return "x".join(map(str, op.out.shape)) if op else ""


def _ratio(e: float, e_in: float) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(e) / np.float64(e_in)) if e > 0 else 0.0


def _upstream(sources: tuple[int, ...], ops: dict[int, Op], errors: dict[int, float], input_error: float
              ) -> tuple[float, list[Op]]:
    """(the largest error of the nearest paired ops, or the module input, a value made from
    ``sources`` comes from; the unpaired ops walked through on the way)."""
    worst, gap, todo, seen = 0.0, [], list(sources), set()
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        if s == MODULE_INPUT:
            worst = max(worst, input_error)
        elif id(ops[s]) in errors:
            worst = max(worst, errors[id(ops[s])])
        else:
            gap.append(ops[s])
            todo.extend(x for srcs in ops[s].arg_sources for x in srcs)
    return worst, gap
