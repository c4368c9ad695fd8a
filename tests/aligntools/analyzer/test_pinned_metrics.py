"""Pinned metrics: ``compare`` gives bit-identical numbers and verdicts across rewrites.

Why pin bits, not tolerances: the metric kernels are rewritten for speed (chunking, threads,
fused passes), and a speed-up that moves a relative error in its last bit can still flip a
verdict sitting on a limit. Every number of ``Comparison.table`` (limits, growth and
verdicts included), the jumping sites, the routing diff, the first divergence, the diagnosis
and a digest of each per-token metric array is compared, as exact text (floats as their
round-trip ``repr``), with ``pinned_metrics.json``, written by the code *before* the rewrite.

The scenarios are the synthetic captures of the other analyzer tests (planted noise, NaN
rows, stats mode, decode layouts, routing flips, a reference run) plus bench-sized rows
that exercise multi-chunk, blocked-dot and awkward-width paths. Bits also depend on the
numeric primitives of the machine (OpenBLAS's dot kernel for the CPU, numpy's SIMD exp):
the fixture records digests of them (``_env``), and where they differ the test is skipped,
not failed. Regenerate (only when a change of numbers is intended and explained) with::

    .venv/bin/python -m tests.aligntools.analyzer.test_pinned_metrics
"""

from __future__ import annotations

import hashlib
import json
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
ENV = "_env"


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
        # chunk of one row, which einsum rounds differently: chunk boundaries are pinned too
        "bench_prime_vocab": _bench(8209, tokens=197, workers=2),
    }


def _enc(x: Any) -> Any:
    """Exact text of a value: floats as their shortest round-trip ``repr`` (``float(text)``
    gives back the same bits; more compact than ``float.hex``), the rest as is."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        return repr(float(x))  # shortest text that reads back to the same double: exact
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (tuple, list)):
        return [_enc(v) for v in x]
    return None if x is None or x is pd.NA else str(x)


def _column(values: pd.Index | pd.Series) -> list[Any] | dict[str, Any]:
    """Exact values in row order; a constant column (all NaN, all 0) as ``{"all": value}``."""
    enc = [_enc(v) for v in values]
    return {"all": enc[0]} if len(enc) > 1 and all(v == enc[0] for v in enc) else enc


def _frame(df: pd.DataFrame) -> dict[str, Any]:
    """Column -> exact values (the index under ``""``): compact, and a diff names the column."""
    return {"": _column(df.index)} | {str(c): _column(df[c]) for c in df.columns}


def _digest(rows: dict[str, np.ndarray]) -> str:
    """sha256 of the per-token arrays (float64, one NaN spelling), in name order."""
    h = hashlib.sha256()
    for k in sorted(rows):
        v = np.asarray(rows[k], dtype=np.float64)
        h.update(k.encode() + np.where(np.isnan(v), np.nan, v).tobytes())
    return h.hexdigest()[:16]


def environment() -> dict[str, str]:
    """Digests of the primitives the metrics are built from, on fixed inputs: BLAS dot
    products (numpy.vecdot), numpy's pairwise row sums, SIMD exp/log, einsum."""
    x, y = np.random.default_rng(0).standard_normal((2, 3, 9001))
    parts = {"vecdot": [np.vecdot(x[:, :w], y[:, :w]) for w in (16, 37, 2048, 8192)],
             "sum": [x[:, :w].sum(axis=1) for w in (16, 37, 2048, 9001)],
             "exp_log": [np.exp(x), np.log(np.abs(x))],
             "einsum": [np.einsum("ij,ij->i", x[:r], y[:r]) for r in (1, 3)]}
    return {k: hashlib.sha256(b"".join(v.tobytes() for v in vs)).hexdigest()[:16] for k, vs in parts.items()}


def snapshot(cmp: Comparison) -> dict[str, Any]:
    """Everything a user reads off a comparison, as exact text."""
    fd = cmp.first_divergence
    return {
        "table": _frame(cmp.table),
        "jumps": list(cmp.growth.index[cmp.growth["jumps"]]),
        "routing": _frame(cmp.routing),
        "per_token": {s: _digest(r.rows) for s, r in cmp.results.items()},
        "first_divergence": None if fd is None else {k: _enc(v) for k, v in vars(fd).items()},
        "diagnosis": [str(f) for f in cmp.diagnosis],
        "passes": cmp.passes,
        "failures": cmp.failures,
        "only": [list(cmp.only_a), list(cmp.only_b)],
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    spec = dict(spec)
    return snapshot(aligntools.compare(spec.pop("a"), spec.pop("b"), **spec))


@pytest.fixture(scope="module")
def pinned() -> dict[str, Any]:
    pins = json.loads(FIXTURE.read_text())
    if pins.pop(ENV) != environment():
        pytest.skip("this machine's BLAS/SIMD primitives round differently from the one the pins were made on")
    return pins


@pytest.fixture(scope="module")
def specs() -> dict[str, dict[str, Any]]:
    return scenarios()


@pytest.mark.parametrize("path", ["0", "1"], ids=["numpy", "compiled"])
@pytest.mark.parametrize("name", [k for k in json.loads(FIXTURE.read_text()) if k != ENV] if FIXTURE.exists() else [])
def test_metrics_are_bit_identical_to_the_pinned_ones(name, path, specs, pinned, monkeypatch):
    """Both paths of the row kernels (``compiled_metrics.ENV_SWITCH``) give the pinned bits."""
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, path)
    assert path == "0" or compiled_path_agrees()  # same machine primitives as the pins: the kernels run
    got, want = run(specs[name]), pinned[name]
    diff = [f"{part}.{key}: {got[part].get(key)} != {want[part].get(key)}"
            for part in ("table", "routing", "per_token") for key in want[part]
            if got[part].get(key) != want[part][key]]
    assert not diff, "\n".join(diff[:10])
    assert got == want


def test_every_scenario_is_pinned(specs, pinned):
    assert set(specs) == set(pinned)


if __name__ == "__main__":
    pins = {ENV: environment()} | {name: run(spec) for name, spec in scenarios().items()}
    FIXTURE.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                                          for k, v in pins.items()) + "\n}\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size / 1024:.0f} KiB)")
