"""minirl.algorithms.corrections: hand-computed cases and an independent float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algorithms import corrections

LOG = math.log


def _case():
    """rho per token: [0.25, 1.0, 3.0, 8.0 | 0.6, 1.5, pad, pad]."""
    rho = torch.tensor([[0.25, 1.0, 3.0, 8.0], [0.6, 1.5, 1.0, 1.0]], dtype=torch.float64)
    logp_infer = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -1.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    return (logp_infer + rho.log()).float(), logp_infer.float(), mask, rho


def test_icepop_zeroes_outside_band_and_keeps_mask():
    lt, li, mask, rho = _case()
    w, m, metrics = corrections.icepop(lt, li, mask, alpha=0.5, beta=5.0)
    expected = torch.tensor([[0.0, 1.0, 3.0, 0.0], [0.6, 1.5, 0.0, 0.0]])
    torch.testing.assert_close(w, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(m, mask)  # rejected tokens stay in the denominator
    assert metrics["frac_clipped_low"] == pytest.approx(1 / 6)
    assert metrics["frac_clipped_high"] == pytest.approx(1 / 6)
    assert metrics["frac_masked"] == pytest.approx(2 / 6)


def test_tis_truncates_at_cap_token_and_sequence():
    lt, li, mask, rho = _case()
    w, m, metrics = corrections.tis(lt, li, mask, level="token", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.25, 1.0, 2.0, 2.0], [0.6, 1.5, 0.0, 0.0]]), rtol=1e-6, atol=1e-6)
    assert metrics["frac_clipped_high"] == pytest.approx(2 / 6)
    w, _, _ = corrections.tis(lt, li, mask, level="sequence", cap=2.0)
    seq0, seq1 = min(0.25 * 1 * 3 * 8, 2.0), min(0.6 * 1.5, 2.0)  # 6 -> 2, 0.9 stays
    torch.testing.assert_close(w, torch.tensor([[seq0] * 4, [seq1, seq1, 0, 0]]), rtol=1e-5, atol=1e-6)
    assert torch.equal(m, mask)


def test_mis_levels():
    lt, li, mask, rho = _case()
    w, _, _ = corrections.mis(lt, li, mask, level="token", low=0.5, high=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.6, 1.5, 0.0, 0.0]]), rtol=1e-6, atol=1e-6)
    w, _, _ = corrections.mis(lt, li, mask, level="sequence", low=0.5, high=2.0)  # 6 rejected, 0.9 kept
    torch.testing.assert_close(w, torch.tensor([[0.0] * 4, [0.9, 0.9, 0, 0]]), rtol=1e-5, atol=1e-6)
    w, _, _ = corrections.mis(lt, li, mask, level="geometric", low=0.5, high=2.0)
    g0, g1 = 6 ** 0.25, 0.9 ** 0.5  # 1.565 and 0.949: both kept
    torch.testing.assert_close(w, torch.tensor([[g0] * 4, [g1, g1, 0, 0]]), rtol=1e-5, atol=1e-6)


def _reference_metrics(lt, li, mask):
    """Independent float64 loop over valid tokens."""
    vals = [(float(a), float(b)) for a, b, m in zip(lt.flatten(), li.flatten(), mask.flatten()) if m]
    n = len(vals)
    k1 = sum(b - a for a, b in vals) / n
    k3 = sum(math.exp(a - b) - 1 - (a - b) for a, b in vals) / n
    diffs = [abs(a - b) for a, b in vals]
    return {"mismatch_kl_k1": k1, "mismatch_kl_k3": k3, "abs_dlogp_max": max(diffs), "abs_dlogp_mean": sum(diffs) / n}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_float64_reference(seed):
    g = torch.Generator().manual_seed(seed)
    li = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 4
    lt = li + torch.randn(6, 9, generator=g, dtype=torch.float64) * 0.8
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    w, _, metrics = corrections.icepop(lt.float(), li.float(), mask, alpha=0.5, beta=5.0)
    for i in range(6):
        for j in range(9):
            rho = math.exp(float(lt[i, j].float()) - float(li[i, j].float()))
            want = rho if mask[i, j] and 0.5 <= rho <= 5.0 else 0.0
            assert float(w[i, j]) == pytest.approx(want, rel=1e-5, abs=1e-6)
    for k, v in _reference_metrics(lt.float(), li.float(), mask).items():
        assert metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-7)
    kept = [float(x) for x, m in zip(w.flatten(), mask.flatten()) if m]
    assert metrics["ess"] == pytest.approx(sum(kept) ** 2 / (len(kept) * sum(x * x for x in kept)), rel=1e-6)
    # sequence TIS: product of the ratios, truncated
    w, _, _ = corrections.tis(lt.float(), li.float(), mask, level="sequence", cap=2.0)
    for i in range(6):
        log_seq = sum(float(lt[i, j].float()) - float(li[i, j].float()) for j in range(9) if mask[i, j])
        assert float(w[i][mask[i].bool()][0]) == pytest.approx(min(math.exp(log_seq), 2.0), rel=1e-4)


def test_weights_are_detached():
    lt, li, mask, _ = _case()
    lt.requires_grad_(True)
    w, _, _ = corrections.icepop(lt, li, mask)
    assert not w.requires_grad


def test_masked_token_stats():
    w = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    mask = torch.ones(2, 2)
    logp = torch.tensor([[-3.0, -1.0], [-1.0, -1.0]])
    ent = torch.tensor([[2.0, 0.5], [0.5, 0.5]])
    s = corrections.masked_token_stats(w, mask, logp, ent)
    assert s["logp_masked"] == -3.0 and s["entropy_masked"] == 2.0
    assert s["logp_all"] == pytest.approx(-1.5) and s["entropy_all"] == pytest.approx(0.875)


@pytest.mark.parametrize("call, match", [
    (lambda a, b, m: corrections.icepop(a, b, m, alpha=5.0, beta=0.5), "alpha"),
    (lambda a, b, m: corrections.icepop(a, b, m, alpha=2.0, beta=2.0), "alpha"),
    (lambda a, b, m: corrections.mis(a, b, m, low=2.0, high=1.0), "low"),
    (lambda a, b, m: corrections.mis(a, b, m, level="tokens"), "level"),
    (lambda a, b, m: corrections.tis(a, b, m, cap=0.0), "cap"),
    (lambda a, b, m: corrections.tis(a, b, m, level="geometric"), "level"),
    (lambda a, b, m: corrections.tis(a, b[:, :2], m), "shape"),
])
def test_bad_arguments(call, match):
    lt, li, mask, _ = _case()
    with pytest.raises(ValueError, match=match):
        call(lt, li, mask)
