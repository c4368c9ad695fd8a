"""Metric kernels: known values, NaN/Inf handling, chunking and dtype invariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aligntools.analyzer import logit_metrics as L
from aligntools.analyzer import metrics as M
from aligntools.analyzer.routing_diff import topk_rows


def logit_rows(a, b, next_ids, valid=None):
    """Per-token logits metrics as the analyzer computes them: ``row_metrics`` with the next
    ids, rows outside ``valid`` NaN (``mask_rows``)."""
    return L.mask_rows(M.row_metrics(a, b, next_ids=next_ids), valid)


def site_metrics(a, b, **kw):
    return {k: float(v) for k, v in M.derive(M.aggregate(M.row_sums(a, b, **kw))).items()}


def test_known_values():
    a = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    b = a + np.array([[0, 0, 0, 0.01]], dtype=np.float32)
    m = site_metrics(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    d = b64 - a64
    assert m["max_abs"] == pytest.approx(np.abs(d).max())
    assert m["mean_abs"] == pytest.approx(np.abs(d).mean())
    assert m["rel_l2"] == pytest.approx(np.linalg.norm(d) / np.linalg.norm(a64))
    cos = float((a64 * b64).sum() / np.linalg.norm(a64) / np.linalg.norm(b64))
    assert m["cosine"] == pytest.approx(cos, abs=1e-15)
    assert m["sqnr_db"] == pytest.approx(10 * np.log10(30 / (d**2).sum()))
    assert m["permille_err"] == 0.25  # only the last element is off by more than 1e-3 relative


def test_identical_is_exactly_zero():
    a = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    m = site_metrics(a, a.copy())
    assert (m["max_abs"], m["rel_l2"], m["ulp_max"], m["permille_err"]) == (0, 0, 0, 0)
    assert m["cosine"] == 1.0 and m["sqnr_db"] == np.inf


def test_bf16_ulp_distance_counts_representable_steps():
    x = torch.tensor([1.0, -3.5, 0.0078125, -0.0], dtype=torch.bfloat16)
    up = torch.nextafter(x, torch.full_like(x, float("inf")))  # one bf16 ULP up
    two = torch.nextafter(up, torch.full_like(x, float("inf")))
    a = x.float().numpy()[:, None]
    rows = M.derive(M.row_sums(a, up.float().numpy()[:, None]))
    np.testing.assert_allclose(rows["ulp_max"][:3], 1.0)
    np.testing.assert_allclose(M.derive(M.row_sums(a, two.float().numpy()[:, None]))["ulp_max"][:3], 2.0)
    # -0.0 -> smallest positive bf16 crosses zero: still a tiny distance, not 2**31
    assert rows["ulp_max"][3] < 2


def test_nan_inf_on_one_side_is_counted_not_propagated():
    a = np.ones((3, 4), dtype=np.float32)
    b = a.copy()
    b[1, 2] = np.nan
    b[2, 0] = np.inf
    a[2, 0] = np.inf  # same inf on both sides: consistent
    rows = M.derive(M.row_sums(a, b))
    assert rows["nonfinite_b"].tolist() == [0, 1, 1]
    assert rows["nonfinite_mismatch"].tolist() == [0, 1, 0]
    assert np.all(rows["rel_l2"] == 0) and np.all(np.isfinite(rows["cosine"]))


def test_chunked_threaded_equals_direct(monkeypatch):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((301, 3, 5)).astype(np.float32)
    b = (a + 1e-3 * rng.standard_normal(a.shape)).astype(np.float32)
    idx = rng.permutation(301)
    monkeypatch.setattr(M, "CHUNK_ELEMS", 64)  # many chunks of ~4 rows
    rows = M.derive(M.row_sums(a, b, idx, idx, workers=2))
    a2, b2 = a[idx].reshape(301, -1).astype(np.float64), b[idx].reshape(301, -1).astype(np.float64)
    np.testing.assert_allclose(rows["rel_l2"], np.linalg.norm(b2 - a2, axis=1) / np.linalg.norm(a2, axis=1))
    np.testing.assert_allclose(rows["max_abs"], np.abs(b2 - a2).max(axis=1))


def test_float64_side_is_compared_in_float64():
    a = np.random.default_rng(2).standard_normal((4, 8))
    b32 = a.astype(np.float32)
    m = site_metrics(a, b32)
    assert 0 < m["rel_l2"] < 1e-7  # fp32 rounding of a float64 reference is visible, not lost


def test_logit_metrics_match_torch():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 11)).astype(np.float32) * 3
    b = (a + 0.05 * rng.standard_normal(a.shape)).astype(np.float32)
    nxt = np.array([1, 4, 0, 10, -1, 3])
    r = logit_rows(a, b, nxt)
    la, lb = (torch.log_softmax(torch.tensor(x, dtype=torch.float64), -1) for x in (a, b))
    kl = (la.exp() * (la - lb)).sum(-1).numpy()
    np.testing.assert_allclose(r["kl"], kl, rtol=1e-10)
    exp = np.abs((lb - la).numpy()[np.arange(6), np.maximum(nxt, 0)])
    np.testing.assert_allclose(r["dlogprob"][nxt >= 0], exp[nxt >= 0])
    assert np.isnan(r["dlogprob"][4])
    assert r["top1"].tolist() == (la.argmax(-1) == lb.argmax(-1)).double().tolist()
    s = L.logit_summary(r)
    assert s["dlogprob_max"] == pytest.approx(np.nanmax(r["dlogprob"]))


def test_topk_set_and_order_flips():
    a = np.array([[1, 2], [1, 2], [1, 2]])
    b = np.array([[1, 2], [2, 1], [1, 3]])
    r = topk_rows(a, b)
    assert r["set_flip"].tolist() == [0, 0, 1] and r["order_flip"].tolist() == [0, 1, 0]


def test_all_nan_row_on_one_side_is_missing_not_a_nan_finding():
    """The Tracker fills rows a site did not emit with NaN (e.g. prompt logits under generate)."""
    a = np.ones((3, 4), dtype=np.float32)
    b = a * 1.01
    b[1] = np.nan
    s = M.row_sums(a, b)
    rows = M.derive(s)
    assert rows["missing_b"].tolist() == [0, 1, 0] and rows["nonfinite_mismatch"].sum() == 0
    assert np.isnan(rows["rel_l2"][1]) and rows["rel_l2"][0] == pytest.approx(0.01, rel=1e-5)
    lr = logit_rows(a, b, np.array([0, 1, -1]), valid=s["n_valid"] > 0)
    assert np.isnan(lr["top1"][1]) and L.logit_summary(lr)["top1_agree"] == 1.0


def test_kl_with_masked_vocab_entries():
    """-inf logits (a masked vocabulary) on both sides contribute nothing, not NaN."""
    a = np.array([[0.0, 1.0, -np.inf], [2.0, 0.5, -np.inf]], dtype=np.float32)
    b = a + np.array([[0.1, 0.0, 0.0], [0.0, 0.2, 0.0]], dtype=np.float32)
    r = logit_rows(a, b, np.array([1, -1]))
    la, lb = (torch.log_softmax(torch.tensor(x[:, :2], dtype=torch.float64), -1) for x in (a, b))
    np.testing.assert_allclose(r["kl"], (la.exp() * (la - lb)).sum(-1).numpy(), rtol=1e-9)
