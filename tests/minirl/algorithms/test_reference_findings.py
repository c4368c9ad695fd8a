"""Numbers checked against independent float64 transcriptions of the papers' equations and of the
reference implementations (verl's core_algos.py policy losses, rStar2-Agent's released roc.py).

Each test pins one finding that was wrong before: ESPO quantile groups spilling out of their
sequence, PPO/GSPO overflowing in float32, group advantages of identical rewards, ESPO's
ceil(ρ·n) in float32, and GRPO-RoC's answer-format penalty on unclosed tags. The GSPO test pins
the sequence-mean objective that ``gspo_loss`` aggregates by default.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from decimal import Decimal
from fractions import Fraction

import pytest
import torch

from minirl.algorithms.advantages import grpo_advantages
from minirl.algorithms.espo import EspoConfig, entropy_groups, espo_loss
from minirl.algorithms.losses import gspo_loss, ppo_clip_loss
from minirl.algorithms.roc import answer_format_penalty

F64 = torch.float64


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(loss, x)[0]


# ---- GSPO (Zheng et al. 2025, eq. 5-7): J = 1/G Σ_i min(s_i A_i, clip(s_i) A_i) ----

def _gspo_objective(logp, old, adv, lengths, eps_low, eps_high) -> float:
    """float64 scalars: one length-normalised ratio and one clipped term per sequence."""
    total = 0.0
    for i, n in enumerate(lengths):
        s = math.exp(sum(float(logp[i, t]) - float(old[i, t]) for t in range(n)) / n)
        a = float(adv[i])
        total += min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a)
    return -total / len(lengths)


def test_gspo_default_aggregation_is_the_sequence_mean_objective() -> None:
    lengths = [2, 5]
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)  # opposite advantages, different lengths
    old = torch.zeros(2, 5, dtype=F64)
    loss, _ = gspo_loss(old.clone(), old, adv, mask)
    assert float(loss) == 0.0  # s = 1 for both: +1 and -1 cancel only if each sequence weighs 1/2
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(2, 5, generator=g, dtype=F64)
    logp = old + 1e-4 * torch.randn(2, 5, generator=g, dtype=F64)  # inside and outside the 3e-4 band
    loss, _ = gspo_loss(logp, old, adv, mask)
    assert float(loss) == pytest.approx(_gspo_objective(logp, old, adv, lengths, 3e-4, 4e-4), rel=1e-12)


# ---- ESPO (CompassMax §2.4.2, Eqs. 1-3) with grouping="quantile" ----

def _quantile_groups(entropies: list[float], k: int) -> list[list[int]]:
    """The documented rule: sort by entropy (highest first, ties by position), bin j holds the
    ranks r with floor(r·K/n) = j; empty bins do not exist."""
    n = len(entropies)
    order = sorted(range(n), key=lambda t: (-entropies[t], t))
    bins: dict[int, list[int]] = {}
    for r, t in enumerate(order):
        bins.setdefault(math.floor(Fraction(r * k, n)), []).append(t)
    return list(bins.values())


def _espo_reference(logp, old, adv, ent, mask, vocab, k, alpha) -> torch.Tensor:
    """float64 per-token loops over Eqs. 1-3 (GSPO-token denominator sg[π_θ]); scalar tensor ops
    so that autograd gives the reference gradient too."""
    seq_objs = []
    for i in range(logp.shape[0]):
        valid = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not valid:
            continue
        groups = _quantile_groups([float(ent[i, t]) for t in valid], k)
        group_objs = []
        for tau in groups:
            ts = [valid[j] for j in tau]
            log_s = sum(logp[i, t] - old[i, t] for t in ts) / len(ts)  # Eq. 2
            eps = alpha / len(ts) * sum(float(ent[i, t]) for t in ts) / math.log(vocab)  # Eq. 3
            terms = []
            for t in ts:
                s = torch.exp(log_s.detach() + logp[i, t] - logp[i, t].detach())  # Eq. 1, value s_τ
                a = float(adv[i])
                terms.append(torch.minimum(s * a, s.clamp(1 - eps, 1 + eps) * a))
            group_objs.append(sum(terms) / len(terms))
        seq_objs.append(sum(group_objs) / len(group_objs))
    return -sum(seq_objs) / len(seq_objs)


def _espo_batch(lengths: list[int], t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    logp = (-torch.rand(b, t, generator=g, dtype=F64) * 2).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    ent = torch.rand(b, t, generator=g, dtype=F64) * math.log(50)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    adv = torch.randn(b, generator=g, dtype=F64)
    return logp, old, ent, mask, adv


@pytest.mark.parametrize("k", [2, 3, 4, 5, 9, 40])
@pytest.mark.parametrize("lengths", [[3, 2, 3], [3, 3, 1], [2, 3, 0, 3]])
def test_espo_quantile_groups_stay_in_their_sequence(k: int, lengths: list[int]) -> None:
    """T = 3: K > T + 1 = 4 used to write group ids past a row's T + 1 slots (into the next row or
    the padding slot; on the last row an index error)."""
    logp, old, ent, mask, adv = _espo_batch(lengths, 3, seed=k)
    cfg = EspoConfig(grouping="quantile", n_groups=k, alpha=0.4)
    ids = entropy_groups(ent, mask, cfg)
    assert int(ids.min()) >= 0 and int(ids.max()) <= 3  # ids fit the T + 1 slots of each row
    loss, metrics = espo_loss(logp, old, adv, ent, mask, 50, cfg)
    want = _espo_reference(logp, old, adv, ent, mask, 50, k, 0.4)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_grad(loss, logp), _grad(want, logp), rtol=1e-12, atol=1e-12)
    n_groups = [len(_quantile_groups([0.0] * n, k)) for n in lengths if n]
    assert metrics["espo/groups_per_seq"] == pytest.approx(sum(n_groups) / len(n_groups))


# ---- ESPO top_fraction: ceil(ρ·n) exactly ----

def test_espo_top_fraction_count_is_exact_hand_case() -> None:
    ent = torch.linspace(1.0, 0.0, 50)[None, :]
    ids = entropy_groups(ent, torch.ones(1, 50, dtype=torch.bool), EspoConfig(top_fraction=0.3))
    assert int((ids > 0).sum()) == 15  # 0.3 · 50 = 15, not 16 (float32 0.3 · 50 rounds up)


@pytest.mark.parametrize("rho", [0.15, 0.3, 0.6])
def test_espo_top_fraction_count_matches_decimal_ceil(rho: float) -> None:
    t = 200
    lengths = torch.arange(1, t + 1)
    mask = torch.arange(t)[None, :] < lengths[:, None]  # row i has i + 1 tokens
    ent = torch.rand(t, t, generator=torch.Generator().manual_seed(0))
    ids = entropy_groups(ent, mask, EspoConfig(top_fraction=rho))
    got = (ids > 0).sum(1).tolist()
    want = [math.ceil(Decimal(str(rho)) * n) for n in range(1, t + 1)]
    assert got == want


# ---- PPO and GSPO in float32 with log-ratios past exp's float32 range (log r > 88.7) ----

def _verl_ppo(logp, old, adv, mask, eps_low, eps_high, clip_c, seq_mean=False) -> torch.Tensor:
    """verl core_algos.compute_policy_loss (vanilla; dual-clip unless clip_c is None; token-mean
    or seq-mean-token-mean), float64."""
    neg_kl = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    a = adv[:, None]
    pg = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    if clip_c is not None:
        pg = torch.where(a < 0, torch.min(-a * clip_c, pg), pg)
    if seq_mean:
        return ((pg * mask).sum(-1) / mask.sum(-1)).mean()
    return (pg * mask).sum() / mask.sum()


def _verl_gspo(logp, old, adv, mask, eps_low, eps_high) -> torch.Tensor:
    """verl core_algos.compute_policy_loss_gspo (seq-mean-token-mean), float64."""
    seq = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = torch.clamp(logp - logp.detach() + seq.detach()[:, None], max=10.0)
    s = torch.exp(log_s)
    a = adv[:, None]
    pg = torch.maximum(-a * s, -a * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    return ((pg * mask).sum(-1) / mask.sum(-1)).mean()


def _overflow_batch():
    """Row 0 has log r = 100 on every token (exp overflows float32 past 88.72)."""
    old = torch.tensor([[-100.0, -100.0, -100.0], [-0.5, -1.2, -0.3], [-2.0, -0.1, -0.7]], dtype=F64)
    logp = torch.tensor([[0.0, 0.0, 0.0], [-0.4, -1.5, -0.3], [-1.8, -0.2, -0.7]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=F64)
    return logp, old, mask


@pytest.mark.parametrize("adv0", [0.0, 1.0, -1.0])
def test_ppo_float32_huge_log_ratio_matches_verl(adv0: float) -> None:
    logp64, old, mask = _overflow_batch()
    adv = torch.tensor([adv0, 0.7, -0.4], dtype=F64)
    lp32 = logp64.float().requires_grad_()
    loss, _ = ppo_clip_loss(lp32, old.float(), adv.float(), mask.float(), 0.2, 0.28, 3.0)
    grad = _grad(loss, lp32)
    assert torch.isfinite(loss) and bool(torch.isfinite(grad).all())
    lp64 = logp64.clone().requires_grad_()
    want = _verl_ppo(lp64, old, adv, mask, 0.2, 0.28, 3.0)
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), _grad(want, lp64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("adv0", [0.0, 1.0, -1.0])
def test_gspo_float32_huge_sequence_ratio_matches_verl(adv0: float) -> None:
    logp64, old, mask = _overflow_batch()
    adv = torch.tensor([adv0, 0.7, -0.4], dtype=F64)
    lp32 = logp64.float().requires_grad_()
    loss, _ = gspo_loss(lp32, old.float(), adv.float(), mask.float(), 0.2, 0.28)
    grad = _grad(loss, lp32)
    assert torch.isfinite(loss) and bool(torch.isfinite(grad).all())
    lp64 = logp64.clone().requires_grad_()
    want = _verl_gspo(lp64, old, adv, mask, 0.2, 0.28)
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), _grad(want, lp64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("adv0", [0.0, 1.0, -1.0])
def test_espo_float32_huge_log_ratio_matches_clamped_token_ppo(adv0: float) -> None:
    """ρ = 1 and a fixed ε make ESPO token-level PPO (seq-mean-token-mean, no dual clip)."""
    logp64, old, mask = _overflow_batch()
    adv = torch.tensor([adv0, 0.7, -0.4], dtype=F64)
    lp32 = logp64.float().requires_grad_()
    cfg = EspoConfig(top_fraction=1.0, clip_eps=0.2)
    loss, _ = espo_loss(lp32, old.float(), adv.float(), torch.ones(3, 3), mask.bool(), 50, cfg)
    grad = _grad(loss, lp32)
    assert torch.isfinite(loss) and bool(torch.isfinite(grad).all())
    lp64 = logp64.clone().requires_grad_()
    want = _verl_ppo(lp64, old, adv, mask, 0.2, 0.2, None, seq_mean=True)
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), _grad(want, lp64), rtol=1e-6, atol=1e-6)


# ---- GRPO advantages (DeepSeekMath §4.1.2) from float64 rewards ----

def _grpo_reference(rewards: list[float], group_size: int, eps: float) -> list[float]:
    """statistics.mean / stdev are exact-rational internally: an identical group is exactly 0."""
    out = []
    for g in range(0, len(rewards), group_size):
        grp = rewards[g:g + group_size]
        mu, sd = statistics.mean(grp), statistics.stdev(grp)
        out += [(r - mu) / (sd + eps) for r in grp]
    return out


@pytest.mark.parametrize("group_size", [3, 5, 7, 8, 16])
def test_identical_rewards_give_exactly_zero_advantage(group_size: int) -> None:
    for value in (0.7, 0.1, 1 / 3, 123.456):
        adv = grpo_advantages(torch.full((2 * group_size,), value, dtype=F64), group_size)
        assert adv.tolist() == [0.0] * (2 * group_size), value
        assert grpo_advantages(torch.full((group_size,), value, dtype=F64), group_size,
                               normalize_std=False).tolist() == [0.0] * group_size


def test_grpo_advantages_match_exact_statistics() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(6 * 5, generator=g, dtype=F64) * 3).tolist()
    rewards[5:10] = [0.7] * 5  # one zero-variance group among ordinary ones
    rewards[10:15] = [0.7, 0.7, 0.7, 0.7, 0.7 + 1e-9]  # a near-constant group
    adv = grpo_advantages(torch.tensor(rewards, dtype=F64), 5)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv.double(), torch.tensor(_grpo_reference(rewards, 5, 1e-6), dtype=F64),
                               rtol=1e-6, atol=1e-7)


# ---- GRPO-RoC answer-format penalty (rStar2-Agent Eq. 5, closed matched tags) ----

def _rstar_format_penalty(text: str, n_turns: int) -> float:
    """rStar2-Agent's released rule: both tags present, and the counts of <answer> and </answer>
    both equal the number of non-greedy closed blocks; else 1. Then Eq. 5 on that count."""
    if "<answer>" not in text or "</answer>" not in text:
        return 1.0
    closed = len(re.findall(r"<answer>.*?</answer>", text, re.DOTALL))
    if text.count("<answer>") != closed or text.count("</answer>") != closed:
        return 1.0
    return min((closed - 1) / n_turns, 1.0)


@pytest.mark.parametrize("text, n_turns, want", [
    ("<reason>r</reason><answer>\\boxed{3}</answer>", 1, 0.0),
    ("no tags at all", 2, 1.0),
    ("<answer>\\boxed{3}", 1, 1.0),  # unclosed
    ("<answer><answer>3</answer></answer>", 2, 1.0),  # nested
    ("<answer>3</answer> more <answer>4</answer>", 4, 0.25),  # two answers: (2 - 1) / 4
    ("<answer>1</answer><answer>2</answer><answer>3</answer>", 1, 1.0),  # min(1, 2 / 1)
    ("</answer>3<answer>", 1, 1.0),  # closed before open
    ("<answer>3</answer><answer>4", 3, 1.0),  # second one unclosed
    ("3</answer>", 1, 1.0),  # close only
])
def test_answer_format_penalty_hand_cases(text: str, n_turns: int, want: float) -> None:
    assert answer_format_penalty(text, n_turns) == want == _rstar_format_penalty(text, n_turns)


def test_answer_format_penalty_matches_rstar_rule_on_random_tag_strings() -> None:
    rnd = random.Random(0)
    pieces = ["<answer>", "</answer>", "x", "\n", "<reason>"]
    for _ in range(2000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 8)))
        n_turns = rnd.randint(1, 4)
        assert answer_format_penalty(text, n_turns) == _rstar_format_penalty(text, n_turns), text
