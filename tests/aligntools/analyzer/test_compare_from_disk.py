"""A capture larger than the memory cap is compared from disk, in tiles, to the same numbers.

Why: a long capture of a real model (tens of GB of hidden states) does not fit in memory,
and ``compare`` must not need it to: paths are opened lazily and read tile by tile within
``max_memory``. The cap is checked with ``tracemalloc`` (numpy's allocations are traced),
and the result must be bit-identical to comparing the same captures in memory.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import xarray as xr

import aligntools
from aligntools import Capture
from aligntools.analyzer import compiled_metrics
from aligntools.analyzer.metrics import compiled_path_agrees
from tests.aligntools.analyzer.analyzer_synth import make_capture
from tests.aligntools.analyzer.test_bad_input import to_stats
from tests.aligntools.analyzer.test_pinned_metrics import snapshot

CAP = 16 << 20  # bytes compare may hold; each capture below is 4x that
SITES = ("embed", "L0.resid_post", "final_norm", "logits")


def wide_capture(tokens: int, width: int, seed: int) -> xr.Dataset:
    """``SITES`` of ``width`` fp32 values per token, with the synthetic captures' coords and attrs."""
    base = make_capture(n_layers=1, requests=tokens // 8, seq=8, seed=seed)
    rng = np.random.default_rng(seed)
    data = {s: (("token", "d"), rng.standard_normal((tokens, width), dtype=np.float32), {"dtype": "float32"})
            for s in SITES}
    return xr.Dataset(data, coords=base.coords, attrs=base.attrs)


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """(a, b) in memory and saved: b = a + 1e-3 noise, its rows in another order (aligned by
    request/position, so b's rows are gathered), two logits rows not captured (NaN)."""
    a = wide_capture(tokens=1024, width=4096, seed=0)
    rng = np.random.default_rng(1)
    b = a.copy(deep=True)
    for s in SITES:
        b[s].values[...] += np.float32(1e-3) * rng.standard_normal(b[s].shape, dtype=np.float32)
    b["logits"].values[:2] = np.nan
    b = b.isel(token=rng.permutation(a.sizes["token"]))
    root = tmp_path_factory.mktemp("wide")
    return a, b, Capture(a).save(root / "a.nc"), Capture(b).save(root / "b.nc")


def test_captures_are_larger_than_the_cap(on_disk):
    a, b, *_ = on_disk
    assert min(a.nbytes, b.nbytes) > 4 * CAP


@pytest.mark.parametrize("compiled", ["0", "1"], ids=["numpy", "compiled"])
def test_compare_from_disk_stays_under_the_cap_and_gives_the_same_numbers(on_disk, compiled, monkeypatch):
    a, b, path_a, path_b = on_disk
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, compiled)
    assert compiled_path_agrees()  # compiles the kernels before tracing: a one-time cost, not capture data
    tracemalloc.start()
    try:
        cmp = aligntools.compare(path_a, path_b, max_memory=CAP)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < CAP, f"peak {peak / 2**20:.1f} MiB of traced allocations > cap {CAP / 2**20:.0f} MiB"
    assert snapshot(cmp) == snapshot(aligntools.compare(a, b))
    assert cmp.table.loc["logits", "missing_b"] == 2 and np.isfinite(cmp.table.loc["logits", "kl_mean"])


def test_progress_bar_on_request(on_disk, capsys):
    *_, path_a, path_b = on_disk
    aligntools.compare(path_a, path_b, sites="embed", max_memory=CAP, progress=True)
    assert "compare" in capsys.readouterr().err


def test_stats_of_a_tensor_capture_on_disk_are_read_in_blocks(synth, tmp_path):
    """Stats mode vs tensor mode: the tensor side's stats are computed block by block from
    disk (a 256-byte budget: two rows per block), to the same numbers as in memory."""
    stats = to_stats(synth)
    path_t, path_s = Capture(synth).save(tmp_path / "t.nc"), Capture(stats).save(tmp_path / "s.nc")
    assert snapshot(aligntools.compare(path_s, path_t, max_memory=256)) == snapshot(aligntools.compare(stats, synth))
