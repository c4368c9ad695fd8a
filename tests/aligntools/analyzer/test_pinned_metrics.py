"""Pinned metrics: ``compare`` gives the same numbers and verdicts across rewrites and CPUs.

What is pinned: every value of ``Comparison.table`` (limits, growth and verdicts included), the
jumping sites, the routing diff, the first divergence, the diagnosis and a summary of each
per-token metric array (mean |x|, max, NaN and inf counts), in ``pinned_metrics.json``,
written by the code *before* a rewrite. Names, verdicts, counts and text are compared exactly;
floats within the error of a float64 summation, since the metric kernels are rewritten for speed
(chunking, threads, fused passes, compiled kernels) and each CPU rounds its own way (BLAS
blocking, SIMD width, numpy's SIMD exp), so bits are neither machine-independent nor the point:

* ``REL``: every metric is a function of float64 sums of float32-widened products (exact: 24 + 24
  bits fit in 53), so only summation rounds. A sum of n terms is within n 2^-53 of its exact
  value in any order; a ratio or root of two such sums (rel-L2, cosine, growth, limits) within
  2n 2^-53. The largest site here has 4e6 elements: 8.9e-10 <= 1e-9 (``test_tolerance_covers_the_sums``).
* ``sqnr_db`` is 10 log10 of such a ratio: it may move by 10 / ln 10 * ``REL`` absolute near 0 dB.
* ``LOGZ_ABS``: KL and |Δ logprob| are differences of log-partition functions (log Z = max + log
  sum exp), whatever their own size: each log Z rounds to ~(log2 V + 2) ulps of |log Z| <=
  max|logit| + ln V ~ 16 here, ~1e-13 absolute; 1e-12 leaves 10x (the AMX box's pins and a Zen 3
  run differed by at most 3e-17 there, and by 2.3e-14 relative elsewhere).
* The diagnosis (and the first divergence's reason) prints numbers to a few digits: they are parsed
  out and compared as floats (equal unless a value sits within ``REL`` of a rounding boundary), the
  text around them exactly.

A verdict that flips within these tolerances would sit on its limit: a scenario to move, not a
reason to pin bits. The scenarios are the synthetic captures of the other analyzer tests (planted
noise, NaN rows, stats mode, decode layouts, routing flips, a reference run) plus bench-sized rows
that exercise multi-chunk, blocked-dot and awkward-width paths. Regenerate (only when a change of
numbers is intended and explained) with::

    .venv/bin/python -m tests.aligntools.analyzer.test_pinned_metrics
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import aligntools
from aligntools.analyzer import compiled_metrics
from aligntools.analyzer.metrics import compiled_path_agrees
from aligntools.analyzer.comparison import Comparison
from tests.aligntools.analyzer.analyzer_synth import downstream, make_capture, noise
from tests.aligntools.analyzer.test_bad_input import to_stats
from tests.aligntools.analyzer.test_diagnosis import later, near_tie_flips
from tests.aligntools.analyzer.test_token_align import as_decode

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from bench_compare import build_pair  # noqa: E402

FIXTURE = Path(__file__).with_name("pinned_metrics.json")
REL = 1e-9  # module docstring: float64 sums of up to ~4.5e6 exact products
DB_ABS = 10 / math.log(10) * REL
LOGZ_ABS = 1e-12
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|\b(?:nan|inf)\b")


def _synth() -> xr.Dataset:
    return make_capture(n_layers=3, moe_layers=(1,))


def _floats(ds: xr.Dataset) -> list[str]:
    return downstream("embed", ds)


def _with(ds: xr.Dataset, edit: Callable[[xr.Dataset], None]) -> xr.Dataset:
    out = ds.copy(deep=True)
    edit(out)
    return out


def _dtype_mix(ds: xr.Dataset) -> xr.Dataset:
    b = noise(ds, {s: 1e-4 for s in _floats(ds)}, seed=7)
    b["L0.q"].attrs["dtype"] = "bfloat16"
    return b.assign({"L0.k": b["L0.k"].astype(np.float64) * (1 + 1e-9)})


def _masked_vocab(ds: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """-inf logits on both sides (masked vocab), one +inf mismatch, one one-sided inf."""
    a, b = ds.copy(deep=True), noise(ds, {"logits": 1e-3}, seed=9)
    a["logits"].values[:, 5] = b["logits"].values[:, 5] = -np.inf
    b["logits"].values[3, 7] = np.inf
    b["L0.q"].values[2, 3] = np.inf
    return a, b


def _prefix(ds: xr.Dataset) -> xr.Dataset:
    ids = ds["token_id"].values.copy()
    ids[(ds["request"].values == 1) & (ds["position"].values == 3)] += 1
    return noise(ds, {s: 1e-5 for s in _floats(ds)}, seed=8).assign_coords(token_id=("token", ids))


def _decode_error(ds: xr.Dataset) -> xr.Dataset:
    dec = as_decode(noise(ds, later(ds, "L1.mlp_norm"), seed=3))
    dec["L2.attn_out"].values[4] *= 1.01
    return dec


def _bench(vocab: int, tokens: int = 200, **kw: Any) -> dict[str, Any]:
    a, b = build_pair(tokens=tokens, layers=1, hidden=384, vocab=vocab, seed=vocab)
    return {"a": a, "b": b, **kw}


def scenarios() -> dict[str, dict[str, Any]]:
    """name -> ``compare`` arguments; every capture built from fixed seeds."""
    s = _synth()
    f = _floats(s)
    rt_a, rt_b = near_tie_flips(s, 1, [2, 5, 11], margin=1e-6)
    mv_a, mv_b = _masked_vocab(s)
    return {
        "identical": {"a": s, "b": s.copy(deep=True)},
        "fp32_noise": {"a": s, "b": noise(s, {x: 1e-7 for x in f})},
        "jump": {"a": s, "b": noise(s, {x: 1e-4 * 1.3 ** i for i, x in enumerate(downstream("L1.attn_norm", s))})},
        "growth": {"a": s, "b": noise(s, {x: 1e-4 for x in downstream("L1.attn_norm", s)}
                                      | {"L2.q": 2e-4, "L2.attn_out": 5e-3})},
        "rope": {"a": s, "b": noise(s, later(s, "L1.v") | {"L1.q": 1e-3, "L1.k": 1e-3})},
        "lm_head": {"a": s, "b": noise(s, {"logits": 1e-3, "logprobs": 1e-3, "entropy": 1e-3})},
        "nan_element": {"a": s, "b": _with(s, lambda d: d["L2.mlp_out"].values.__setitem__((3, 1), np.nan))},
        "nan_rows": {"a": s, "b": _with(s, lambda d: d["L1.resid_post"].values.__setitem__(slice(0, 3), np.nan))},
        "missing_logits": {"a": s, "b": _with(s, lambda d: d["logits"].values.__setitem__(slice(0, 2), np.nan))},
        "masked_vocab": {"a": mv_a, "b": mv_b},
        "stats_vs_tensor": {"a": s, "b": to_stats(noise(s, {"L1.mlp_out": 1e-2}))},
        "stats_vs_stats": {"a": to_stats(s), "b": to_stats(noise(s, {x: 1e-3 for x in f}))},
        "dtype_mix": {"a": s, "b": _dtype_mix(s)},
        "decode_layout": {"a": s, "b": _decode_error(s)},
        "sequence": {"a": s, "b": noise(s, {x: 1e-6 for x in f}).assign_coords(
            request=("token", 1 - s["request"].values)), "align": "sequence"},
        "prefix": {"a": s, "b": _prefix(s), "align": "prefix"},
        "reference": {"a": s, "b": noise(s, {x: 1e-3 for x in f}, seed=6),
                      "reference": noise(s, {x: 1e-3 for x in f}, seed=5)},
        "router": {"a": rt_a, "b": noise(rt_b, later(rt_a, "L1.router_logits") | {"L1.router_logits": 1e-3})},
        "bench_blocked_dot": _bench(20000),
        # prime vocab: dot products fall back to einsum, and 197 = 28 x 7 + 1 rows ends in a
        # chunk of one row, which einsum rounds differently: chunk boundaries are exercised too
        "bench_prime_vocab": _bench(8209, tokens=197, workers=2),
    }


def _enc(x: Any) -> Any:
    """A value as JSON: finite floats as floats, NaN and inf as text (standard JSON, and ``==`` holds
    between snapshots of one machine), tuples as lists."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else repr(float(x))
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (tuple, list)):
        return [_enc(v) for v in x]
    return None if x is None or x is pd.NA else str(x)


def _column(values: pd.Index | pd.Series) -> list[Any] | dict[str, Any]:
    """Values in row order; a constant column (all NaN, all 0) as ``{"all": value}``."""
    enc = [_enc(v) for v in values]
    return {"all": enc[0]} if len(enc) > 1 and all(v == enc[0] for v in enc) else enc


def _frame(df: pd.DataFrame) -> dict[str, Any]:
    """Column -> values (the index under ``""``): compact, and a diff names the column."""
    return {"": _column(df.index)} | {str(c): _column(df[c]) for c in df.columns}


def _summary(values: np.ndarray) -> list[Any]:
    """A per-token array as [mean |x|, max] of its finite entries, then its NaN and inf counts."""
    v = np.asarray(values, dtype=np.float64)
    ok = v[np.isfinite(v)]
    stats = [np.abs(ok).mean(), ok.max()] if ok.size else [math.nan] * 2
    return [_enc(x) for x in stats] + [int(np.isnan(v).sum()), int(np.isinf(v).sum())]


def snapshot(cmp: Comparison) -> dict[str, Any]:
    """Everything a user reads off a comparison."""
    fd = cmp.first_divergence
    return {
        "table": _frame(cmp.table),
        "jumps": list(cmp.growth.index[cmp.growth["jumps"]]),
        "routing": _frame(cmp.routing),
        "per_token": {s: {k: _summary(v) for k, v in sorted(r.rows.items())} for s, r in cmp.results.items()},
        "first_divergence": None if fd is None else {k: _enc(v) for k, v in vars(fd).items()},
        "diagnosis": [str(f) for f in cmp.diagnosis],
        "passes": cmp.passes,
        "failures": cmp.failures,
        "only": [list(cmp.only_a), list(cmp.only_b)],
    }


def _close(got: float, want: float, path: str) -> bool:
    """Within ``REL``, plus the absolute floor of log-scale and log-partition values (docstring)."""
    if not (math.isfinite(got) and math.isfinite(want)):
        return got == want or (math.isnan(got) and math.isnan(want))
    floor = LOGZ_ABS if re.search(r"\b(kl|dlogprob)", path) else DB_ABS if "sqnr_db" in path else 0.0
    return abs(got - want) <= REL * max(abs(got), abs(want)) + floor


def diffs(got: Any, want: Any, path: str = "") -> list[str]:
    """Where ``got`` departs from ``want``: floats beyond ``_close``, anything else unequal."""
    constant = [isinstance(x, dict) and set(x) == {"all"} for x in (got, want)]  # ``_column``'s compact form
    if any(constant):
        n = next((len(x) for x in (got, want) if isinstance(x, list)), 1)
        got, want = ([x["all"]] * n if c else x for x, c in zip((got, want), constant))
    if isinstance(got, dict) and isinstance(want, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in want for d in diffs(got[k], want[k], f"{path}.{k}")]
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} != {len(want)} entries"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in diffs(g, w, f"{path}[{i}]")]
    if isinstance(got, str) and isinstance(want, str):  # "nan", "inf", and the numbers text prints
        if NUMBER.sub("#", got) != NUMBER.sub("#", want):
            return [f"{path}: {got!r} != {want!r}"]
        return diffs([float(x) for x in NUMBER.findall(got)], [float(x) for x in NUMBER.findall(want)], path)
    if isinstance(got, float) and isinstance(want, float):
        return [] if _close(got, want, path) else [f"{path}: {got!r} != {want!r}"]
    return [] if type(got) is type(want) and got == want else [f"{path}: {got!r} != {want!r}"]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    spec = dict(spec)
    return snapshot(aligntools.compare(spec.pop("a"), spec.pop("b"), **spec))


@pytest.fixture(scope="module")
def pinned() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def specs() -> dict[str, dict[str, Any]]:
    return scenarios()


@pytest.mark.parametrize("path", ["0", "1"], ids=["numpy", "compiled"])
@pytest.mark.parametrize("name", list(json.loads(FIXTURE.read_text())) if FIXTURE.exists() else [])
def test_metrics_match_the_pinned_ones(name, path, specs, pinned, monkeypatch):
    """Both paths of the row kernels (``compiled_metrics.ENV_SWITCH``) give the pinned values."""
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, path)
    assert path == "0" or compiled_path_agrees()  # the compiled kernels run (they round like numpy here)
    found = diffs(run(specs[name]), pinned[name])
    assert not found, f"{len(found)} differences:\n" + "\n".join(found[:10])


def test_every_scenario_is_pinned(specs, pinned):
    assert set(specs) == set(pinned)


def test_tolerance_covers_the_sums(specs):
    """``REL`` bounds a ratio of two float64 sums over the largest site's elements (docstring)."""
    n = max(ds[v].size for spec in specs.values() for ds in spec.values() if isinstance(ds, xr.Dataset)
            for v in ds.data_vars)
    assert 2 * n * 2.0 ** -53 <= REL, n


if __name__ == "__main__":
    pins = {name: run(spec) for name, spec in scenarios().items()}
    FIXTURE.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                                          for k, v in pins.items()) + "\n}\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size / 1024:.0f} KiB)")
