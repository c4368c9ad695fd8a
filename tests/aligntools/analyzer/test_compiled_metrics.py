"""The compiled row kernels give exactly the numpy path's bits, or are not used.

Why bits: ``compare``'s numbers must not depend on which path computed them (the pinned
metrics hold every number; a verdict on its limit flips on a last-bit change). Each case
runs ``chunk_metrics`` on both paths over hostile rows - every width class of the BLAS
kernel (tail only, 16-lane, 32-lane, blocked), signed zeros, subnormals, huge values,
exact rows, -inf logits (masked vocab), unknown next tokens, NaN/Inf (numpy fallback) - and
compares the bytes of every output.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from aligntools.analyzer import compiled_metrics
from aligntools.analyzer import metrics as M
from aligntools.analyzer.logit_metrics import LOGIT_ROWS


def both_paths(xa: np.ndarray, xb: np.ndarray, next_ids: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """``chunk_metrics`` outputs of the numpy and the compiled path for one chunk."""
    rows = len(xa)
    got = []
    for compiled in (False, True):
        out = {k: np.zeros(rows) for k in M.ROW_SUMS}
        if next_ids is not None:
            out |= {k: np.full(rows, np.nan) for k in LOGIT_ROWS}
        with np.errstate(all="ignore"):
            M.chunk_metrics(xa, xb, M.Workspace(compiled), slice(0, rows), out, next_ids)
        got.append(out)
    return got


def compiled_covers(xa: np.ndarray, xb: np.ndarray) -> bool:
    """Whether the kernels (not the numpy fallback) computed these rows."""
    k = M._dot_block(xa.shape[1])
    return compiled_metrics.covers(xa, xb, k) and compiled_metrics.row_sums(xa, xb, k, M.PERMILLE, compiled_metrics.Scratch()) is not None


def assert_same_bits(got: list[dict[str, np.ndarray]]) -> None:
    numpy_path, compiled = got
    for key, want in numpy_path.items():
        assert want.tobytes() == compiled[key].tobytes(), f"{key}: {want[:4]} != {compiled[key][:4]}"


def pair(rng: np.random.Generator, rows: int, width: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    xa = (rng.standard_normal((rows, width)) * scale * rng.exponential(3.0, (rows, 1))).astype(np.float32)
    xb = (xa * (1 + 1e-3 * rng.standard_normal(xa.shape))).astype(np.float32)
    xb[:, ::3] = xa[:, ::3]  # exact elements
    return xa, xb


@pytest.fixture(autouse=True)
def kernels_agree():
    assert M.compiled_path_agrees(), "the compiled kernels must agree with numpy on the CI machine"


# widths: BLAS tail only (<16), one 16-block, 32-blocks +16 + tail, whole 32-blocks, a row
# dotted in 8192-blocks, one in 4100-blocks (a divisor between 256 and 8192)
@pytest.mark.parametrize("width", [1, 7, 15, 16, 17, 31, 33, 48, 100, 129, 1000, 2048, 4096 + 16 + 7, 16384, 8200])
def test_widths_round_like_numpy(width):
    rng = np.random.default_rng(width)
    xa, xb = pair(rng, max(3, 20000 // width), width)
    assert_same_bits(both_paths(xa, xb, rng.integers(-1, width, len(xa))))
    assert compiled_covers(xa, xb)


@pytest.mark.parametrize("case", ["signed_zeros", "subnormal", "huge", "identical", "sign_flips", "constant"])
def test_hostile_values_round_like_numpy(case):
    rng = np.random.default_rng(1)
    xa, xb = pair(rng, 40, 1000)
    if case == "signed_zeros":
        xa[:, ::2], xb[:, ::2] = -0.0, 0.0
        xa[0], xb[0] = -0.0, -0.0  # all-zero rows: every sum is a signed zero
    elif case == "subnormal":
        xa, xb = xa * np.float32(1e-40), xb * np.float32(1e-40)
    elif case == "huge":
        xa, xb = xa * np.float32(1e30), xb * np.float32(1e30)
    elif case == "identical":
        xb = xa.copy()
    elif case == "sign_flips":
        xb = -xa
    elif case == "constant":
        xa[:], xb[:] = np.float32(3.0), np.float32(3.0000002)
    assert_same_bits(both_paths(xa, xb, rng.integers(-1, 1000, 40)))
    assert compiled_covers(xa, xb)


def test_masked_vocab_logits_round_like_numpy():
    """-inf logits (a masked vocabulary) make the fast KL non-finite: the elementwise form."""
    rng = np.random.default_rng(2)
    xa, xb = pair(rng, 24, 512)
    xa[:, 400:] = xb[:, 400:] = -np.inf
    xb[3, :] = -np.inf  # a row with nothing left
    got = both_paths(xa, xb, rng.integers(0, 400, 24))
    assert_same_bits(got)
    assert got[1]["nonfinite_a"].sum() > 0  # masked by the numpy path: the kernels declined


def test_nan_rows_take_the_numpy_path():
    rng = np.random.default_rng(3)
    xa, xb = pair(rng, 16, 256)
    xb[5, 7] = np.nan
    xb[9] = np.nan  # a row not captured on side b
    got = both_paths(xa, xb)
    assert_same_bits(got)
    assert got[1]["missing_b"][9] == 1 and got[1]["nonfinite_b"][5] == 1
    assert not compiled_covers(xa, xb)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_dtypes_take_the_numpy_path(dtype, monkeypatch):
    rng = np.random.default_rng(4)
    xa, xb = (x.astype(dtype) for x in pair(rng, 8, 64))
    calls = []
    monkeypatch.setattr(compiled_metrics, "row_sums", lambda *a: calls.append(a))
    assert_same_bits(both_paths(xa, xb))
    assert not calls


def test_gathered_and_strided_rows_round_like_numpy():
    """Rows picked by an alignment index, and a non-contiguous view (numpy path)."""
    rng = np.random.default_rng(5)
    xa, xb = pair(rng, 64, 300)
    idx = rng.permutation(64)[:50]
    want = M.row_metrics(xa, xb, idx, idx[::-1].copy(), workers=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(compiled_metrics.ENV_SWITCH, "1")
        got = M.row_metrics(xa, xb, idx, idx[::-1].copy(), workers=2)
    assert all(want[k].tobytes() == got[k].tobytes() for k in want)
    assert not compiled_metrics.covers(xa[:, ::2], xb[:, ::2], 150)


def test_the_switch_and_the_size_threshold(monkeypatch):
    monkeypatch.delenv(compiled_metrics.ENV_SWITCH, raising=False)
    assert not compiled_metrics.wanted(compiled_metrics.MIN_BYTES - 1) and compiled_metrics.wanted(compiled_metrics.MIN_BYTES)
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, "0")
    assert not compiled_metrics.wanted(1 << 40)
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, "1")
    assert compiled_metrics.wanted(1)


def test_a_kernel_that_rounds_differently_is_refused(monkeypatch):
    """A kernel one ULP off (another CPU's BLAS order) is caught by the probe: numpy path, a warning."""
    real = compiled_metrics.row_sums

    def off_by_one_ulp(*args):
        out = real(*args)
        if out is not None:
            out[0] = np.nextafter(out[0], np.inf)
        return out

    monkeypatch.setattr(compiled_metrics, "row_sums", off_by_one_ulp)
    M.compiled_path_agrees.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not M.compiled_path_agrees()
        assert any("round differently" in str(w.message) for w in caught)
    finally:
        M.compiled_path_agrees.cache_clear()


def test_compiled_runs_are_the_same_on_any_thread_count(monkeypatch):
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, "1")
    rng = np.random.default_rng(6)
    xa, xb = pair(rng, 3000, 512)
    one, two = (M.row_metrics(xa, xb, next_ids=np.arange(3000) % 512, workers=w) for w in (1, 2))
    assert all(one[k].tobytes() == two[k].tobytes() for k in one)


def test_without_numba_compare_warns_and_runs_on_numpy(monkeypatch):
    def missing():
        raise ImportError("No module named 'numba'")

    monkeypatch.setattr(compiled_metrics, "kernels", missing)
    monkeypatch.setenv(compiled_metrics.ENV_SWITCH, "1")
    M.compiled_path_agrees.cache_clear()
    try:
        rng = np.random.default_rng(7)
        xa, xb = pair(rng, 50, 256)
        with pytest.warns(UserWarning, match="compiled kernels unavailable"):
            got = M.row_metrics(xa, xb)
        assert got["n_valid"].tolist() == [256] * 50 and np.all(got["sum_d2"] > 0)
    finally:
        M.compiled_path_agrees.cache_clear()
