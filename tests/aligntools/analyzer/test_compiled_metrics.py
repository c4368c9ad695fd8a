"""The compiled row kernels give exactly the numpy path's bits, or are not used.

Why bits: ``compare``'s numbers must not depend on which path computed them (a verdict on
its limit flips on a last-bit change). Which bits numpy gives depends on the OpenBLAS
kernel the CPU gets, so the kernels know several ``ddot`` orders and the probe
(``metrics.ddot_order``) picks the one that agrees. Tested on every box:

- every order, chosen here or not, against a float64 reference (``math.fsum``, exact to one
  rounding) within the summation bound ``gamma_n * sum |x_i y_i|``: each is a correct dot;
- the order this machine chose, on both paths over hostile rows - every width class of the
  BLAS kernels (tail only, 16-lane, 32-lane, blocked), signed zeros, subnormals, huge values,
  exact rows, -inf logits (masked vocab), unknown next tokens, NaN/Inf (numpy fallback) -
  comparing the bytes of every output;
- that the probe refuses the orders this machine does not round in, and says once which
  order it took.
"""

from __future__ import annotations

import logging
import math
import platform
import warnings
from fractions import Fraction

import numpy as np
import pytest

from aligntools.analyzer import compiled_metrics
from aligntools.analyzer import metrics as M
from aligntools.analyzer.logit_metrics import LOGIT_ROWS


def machine_order() -> int:
    """The ``ddot`` order this machine's numpy rounds in. Every x86-64 box CI runs on has
    one the kernels know (OpenBLAS's Haswell/Zen kernel on AVX2, SkylakeX's on AVX-512)."""
    order = M.ddot_order()
    assert order is not None or platform.machine() != "x86_64", "no ddot order of the kernels matches numpy here"
    return order


def both_paths(xa: np.ndarray, xb: np.ndarray, next_ids: np.ndarray | None = None,
               order: int | None = None) -> list[dict[str, np.ndarray]]:
    """``chunk_metrics`` outputs of the numpy path and the compiled one (in ``order``, by
    default this machine's) for one chunk."""
    rows = len(xa)
    got = []
    for ws_order in (None, machine_order() if order is None else order):
        out = {k: np.zeros(rows) for k in M.ROW_SUMS}
        if next_ids is not None:
            out |= {k: np.full(rows, np.nan) for k in LOGIT_ROWS}
        with np.errstate(all="ignore"):
            M.chunk_metrics(xa, xb, M.Workspace(ws_order), slice(0, rows), out, next_ids)
        got.append(out)
    return got


def compiled_covers(xa: np.ndarray, xb: np.ndarray) -> bool:
    """Whether the kernels (not the numpy fallback) computed these rows."""
    k = M._dot_block(xa.shape[1])
    scratch = compiled_metrics.Scratch(machine_order())
    return compiled_metrics.covers(xa, xb, k) and compiled_metrics.row_sums(xa, xb, k, M.PERMILLE, scratch) is not None


def assert_same_bits(got: list[dict[str, np.ndarray]]) -> None:
    numpy_path, compiled = got
    for key, want in numpy_path.items():
        assert want.tobytes() == compiled[key].tobytes(), f"{key}: {want[:4]} != {compiled[key][:4]}"


def pair(rng: np.random.Generator, rows: int, width: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    xa = (rng.standard_normal((rows, width)) * scale * rng.exponential(3.0, (rows, 1))).astype(np.float32)
    xb = (xa * (1 + 1e-3 * rng.standard_normal(xa.shape))).astype(np.float32)
    xb[:, ::3] = xa[:, ::3]  # exact elements
    return xa, xb


ORDERS = compiled_metrics.kernels().DDOT_ORDERS


def fsum_dot(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(x . y correctly rounded, sum |x_i y_i|) of float64 vectors, by ``math.fsum``
    (products split exactly into two doubles each, so the sum is exact before its rounding)."""
    prods = x * y
    return math.fsum([*prods, *_two_prod_lows(x, y, prods)]), float(np.abs(prods).sum())


def _two_prod_lows(x: np.ndarray, y: np.ndarray, prods: np.ndarray) -> list[float]:
    """The rounding errors x_i y_i - fl(x_i y_i), exactly (Dekker's TwoProduct)."""
    def split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = a * 134217729.0  # 2**27 + 1
        hi = c - (c - a)
        return hi, a - hi
    xh, xl = split(x)
    yh, yl = split(y)
    return list(((xh * yh - prods) + xh * yl + xl * yh) + xl * yl)


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u), u = 2**-53: any order of an n-term float64 sum
    (or dot, FMA or not) is within gamma_n * sum |terms| of the exact value."""
    u = 2.0 ** -53
    return n * u / (1 - n * u)


@pytest.mark.parametrize("name", list(ORDERS))
@pytest.mark.parametrize("width", [5, 16, 31, 33, 100, 1000, 4096 + 16 + 7, 16384])
def test_every_order_is_a_correct_dot_product(name, width):
    """Each order's sums (chosen on this box or not) against the exact float64 dot, within
    the summation bound: the orders differ from each other in rounding only."""
    rng = np.random.default_rng(width)
    xa, xb = pair(rng, 3, width)
    scratch = compiled_metrics.Scratch(ORDERS[name])
    k = M._dot_block(width)
    sums = compiled_metrics.row_sums(xa, xb, k, M.PERMILLE, scratch)
    t = rng.standard_normal((3, width))  # the logits' float64 exp row
    diff = compiled_metrics.logit_dots(t, xa, xb, k, scratch)
    for r in range(3):
        a, b = xa[r].astype(np.float64), xb[r].astype(np.float64)
        for got, (x, y) in zip((sums[0, r], sums[1, r], sums[2, r], sums[3, r], diff[r]),
                               ((b - a, b - a), (a, a), (b, b), (a, b), (t[r], b - a))):
            exact, mag = fsum_dot(x, y)
            assert abs(got - exact) <= gamma(width) * mag, (name, width, r, got, exact)


def _fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once (exact rational arithmetic, then one correct rounding)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def transcribed_ddot(x: np.ndarray, y: np.ndarray, name: str) -> float:
    """OpenBLAS's ddot of float64 vectors in the named kernel's order, transcribed from its C
    and assembly (``kernel/x86_64/ddot_microk_{skylakex,haswell}-2.c`` and ``ddot.c``) with
    exact FMAs: a reference for the kernels' bits that no machine's rounding enters."""
    n = len(x)
    n16 = n & -16
    n32 = n16 & ~31 if name == "skylakex" else 0
    acc = [0.0] * 32
    for i in range(n32):  # four 8-wide registers, fused
        acc[i % 32] = _fma(x[i], y[i], acc[i % 32])
    lanes = [acc[8 * (j // 4) + j % 4] + acc[8 * (j // 4) + j % 4 + 4] if n32 else 0.0 for j in range(16)]
    for i in range(n32, n16):  # four 4-wide registers, fused
        lanes[i % 16] = _fma(x[i], y[i], lanes[i % 16])
    if name == "skylakex":
        s = [((lanes[q] + lanes[4 + q]) + lanes[8 + q]) + lanes[12 + q] for q in range(4)]
        total = (s[0] + s[2]) + (s[1] + s[3])
    else:
        h = [[lanes[4 * k + q] + lanes[4 * k + q + 2] for q in (0, 1)] for k in range(4)]
        total = ((h[0][0] + h[1][0]) + (h[2][0] + h[3][0])) + ((h[0][1] + h[1][1]) + (h[2][1] + h[3][1]))
    for i in range(n16, n):  # the C tail: contracted on SkylakeX's build, not on Haswell's
        total = _fma(x[i], y[i], total) if name == "skylakex" else total + x[i] * y[i]
    return total


@pytest.mark.parametrize("name", list(ORDERS))
@pytest.mark.parametrize("width", [1, 7, 16, 17, 31, 32, 33, 48, 63, 95])
def test_every_order_gives_its_kernels_bits(name, width):
    """Each order, bit for bit, against the transcription of its OpenBLAS kernel, on rows
    whose products are inexact in float64 (unrelated rows, a float64 exp row): a wrong lane,
    fold or fused tail changes the bits on any machine."""
    rng = np.random.default_rng(width)
    xa, xb = rng.standard_normal((2, 1, width)).astype(np.float32) * np.float32(1e3)
    xb[0, ::2] *= np.float32(1e-6)
    t = rng.standard_normal((1, width))
    scratch = compiled_metrics.Scratch(ORDERS[name])
    sums = compiled_metrics.row_sums(xa, xb, width, M.PERMILLE, scratch)
    diff = compiled_metrics.logit_dots(t, xa, xb, width, scratch)
    a, b = xa[0].astype(np.float64), xb[0].astype(np.float64)
    want = [transcribed_ddot(x, y, name) for x, y in ((b - a, b - a), (a, a), (b, b), (a, b), (t[0], b - a))]
    assert [*sums[:4, 0], diff[0]] == want


def test_the_probe_refuses_the_orders_this_machine_does_not_round_in():
    """The choice is made by the probe, not assumed: every other order fails it here."""
    chosen = machine_order()
    for name, order in ORDERS.items():
        agrees = all(M._same_bits(xa, xb, ids, order) for xa, xb, ids in M._probe_rows())
        assert agrees == (order == chosen), name


def test_the_choice_is_announced_once(caplog):
    M.ddot_order.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=M.__name__):
            first, second = M.ddot_order(), M.ddot_order()
        said = [r.getMessage() for r in caplog.records if "ddot order" in r.getMessage()]
        assert first == second and len(said) == (first is not None)
        assert first is None or next(n for n, o in ORDERS.items() if o == first) in said[0]
    finally:
        M.ddot_order.cache_clear()


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
    M.ddot_order.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not M.compiled_path_agrees()
        assert any("round differently" in str(w.message) for w in caught)
    finally:
        M.ddot_order.cache_clear()


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
    M.ddot_order.cache_clear()
    try:
        rng = np.random.default_rng(7)
        xa, xb = pair(rng, 50, 256)
        with pytest.warns(UserWarning, match="compiled kernels unavailable"):
            got = M.row_metrics(xa, xb)
        assert got["n_valid"].tolist() == [256] * 50 and np.all(got["sum_d2"] > 0)
    finally:
        M.ddot_order.cache_clear()
