"""Policy losses: pure functions from log-probs, advantages and masks to ``(loss, metrics)``.

Shapes: ``logp``, ``logp_old`` [B, T] (current policy, with grad / behaviour policy, detached);
``advantages`` [B] (one per sequence, GRPO) or [B, T]; ``mask`` [B, T] 0/1; ``weights`` [B, T]
the mismatch-correction weights from ``minirl.algorithms.corrections`` (detached; None = 1). Losses are
to be *minimised* (the negated surrogate objective).

``TrainConfig.loss`` names one of ``POLICY_LOSSES`` (``ppo``, ``gspo`` here, ``espo`` in
``minirl.algorithms.espo``). Every entry takes ``(logp, logp_old, advantages, mask)`` and may name
``weights``, ``entropy_old``, ``vocab_size`` among its parameters to receive them.
"""

from __future__ import annotations

import torch

from minirl.algorithms.registry import Registry

POLICY_LOSSES = Registry("loss")
register_policy_loss = POLICY_LOSSES.register
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k3")
MAX_LOG_RATIO = 20.0
"""|log r| cap before exp, verl's value (core_algos.compute_policy_loss): exp(88.8) is inf in
float32, and -A·inf, 0·inf or the gradient through it turn the whole batch into NaN."""
GSPO_MAX_LOG_RATIO = 10.0
"""Upper cap on GSPO's sequence log-ratio, verl's value (core_algos.compute_policy_loss_gspo)."""


def aggregate(loss_tok: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    ``token-mean``: every token of the batch weighs the same (DAPO §3.3). ``seq-mean-token-mean``:
    mean per sequence, then over sequences (GRPO, Ring-1T §2.3.2 eq. 1's 1/G sum 1/|y_i|).
    ``seq-mean-token-sum``: sum per sequence, mean over sequences (Dr.GRPO: no length bias).
    """
    m = mask.to(loss_tok.dtype)
    if mode == "token-mean":
        return (loss_tok * m).sum() / m.sum().clamp(min=1.0)
    per_seq = (loss_tok * m).sum(-1)  # [B]
    if mode == "seq-mean-token-mean":
        return (per_seq / m.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum":
        return per_seq.mean()
    raise ValueError(f"aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


@register_policy_loss("ppo", eps_low="eps_low", eps_high="eps_high", dual_clip="dual_clip", agg="agg")
def ppo_clip_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = 3.0,
                  weights: torch.Tensor | None = None, agg: str = "token-mean"
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO clip, ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with
    ``r = pi / pi_old`` per token.

    Asymmetric ``eps_high > eps_low`` is DAPO's clip-higher (room for low-probability tokens to
    grow). ``dual_clip = c`` (Ye et al. 2020, "Mastering complex control in MOBA games", §3.2)
    bounds the loss of a negative-advantage token by ``-c A``: with A < 0 a huge ratio would
    otherwise give an unbounded step. None disables it; it must be > 1.
    """
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip={dual_clip}: must be > 1 (typical 3.0) or None to disable")
    adv = _per_token(advantages, logp)
    # log r clamped to ±20 before exp, as verl's compute_policy_loss does (see MAX_LOG_RATIO)
    ratio = torch.exp(torch.clamp(logp - logp_old.detach(), -MAX_LOG_RATIO, MAX_LOG_RATIO))  # [B, T]
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    pg = torch.maximum(pg1, pg2)
    dual = torch.zeros_like(pg, dtype=torch.bool)
    if dual_clip is not None:
        pg3 = -adv * dual_clip
        dual = (adv < 0) & (pg3 < pg)
        pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
    loss_tok = pg if weights is None else pg * weights.detach()
    loss = aggregate(loss_tok, mask, agg)
    m = mask.bool()
    metrics = {
        "pg_loss": float(loss.detach()),
        "clipfrac_low": _frac(m & (ratio < 1 - eps_low) & (adv < 0), m),
        "clipfrac_high": _frac(m & (ratio > 1 + eps_high) & (adv > 0), m),
        "dual_clipfrac": _frac(m & dual, m),
        "ratio_mean": _masked_mean(ratio.detach(), m),
    }
    return loss, metrics


@register_policy_loss("gspo", eps_low="gspo_eps_low", eps_high="gspo_eps_high")  # agg: always its default
def gspo_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              eps_low: float = 3e-4, eps_high: float = 4e-4, weights: torch.Tensor | None = None,
              agg: str = "seq-mean-token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, eq. 5-7): clip the *sequence* ratio
    ``s_i = exp(mean_t log(pi / pi_old))`` instead of each token's.

    Implemented in the GSPO-token form ``s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]``: every token
    carries the value ``s_i`` and the gradient ``s_i * grad log pi(y_t)``, so with
    ``seq-mean-token-mean`` it equals the sequence objective, and it equals token PPO whenever
    all tokens of a sequence share one ratio. Default eps from the GSPO paper (3e-4, 4e-4).
    """
    adv = _per_token(advantages, logp)
    m = mask.to(logp.dtype)
    log_r = (logp - logp_old.detach()) * m  # [B, T]
    log_s = log_r.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1]
    # log s_i capped at 10 before exp, as verl's compute_policy_loss_gspo does (see GSPO_MAX_LOG_RATIO)
    log_s_tok = log_s.detach() + logp - logp.detach()  # [B, T], value log s_i
    s = torch.exp(torch.clamp(log_s_tok, max=GSPO_MAX_LOG_RATIO))
    pg = torch.maximum(-adv * s, -adv * s.clamp(1 - eps_low, 1 + eps_high))
    loss_tok = pg if weights is None else pg * weights.detach()
    loss = aggregate(loss_tok, mask, agg)
    seq = mask.bool().any(-1)  # [B] sequences with at least one token
    s_seq = log_s.detach().clamp(max=GSPO_MAX_LOG_RATIO).exp()[:, 0]
    a_seq = adv[:, 0]  # sequence advantages (GRPO: constant over tokens)
    metrics = {
        "pg_loss": float(loss.detach()),
        "clipfrac_low": _frac(seq & (s_seq < 1 - eps_low) & (a_seq < 0), seq),
        "clipfrac_high": _frac(seq & (s_seq > 1 + eps_high) & (a_seq > 0), seq),
        "ratio_mean": _masked_mean(s_seq, seq),
    }
    return loss, metrics


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, estimator: str = "k3",
               agg: str = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence", 2020):
    ``k1 = log pi - log pi_ref`` (unbiased, can be negative), ``k3 = e^{-k1} - 1 + k1``
    (unbiased for the value, always >= 0, low variance; GRPO, DeepSeekMath §4.1 eq. 4)."""
    log_r = logp - logp_ref.detach()  # [B, T]
    if estimator == "k1":
        kl_tok = log_r
    elif estimator == "k3":
        kl_tok = torch.exp(-log_r) - 1 + log_r
    else:
        raise ValueError(f"KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    loss = aggregate(kl_tok, mask, agg)
    return loss, {f"kl_ref_{estimator}": float(loss.detach())}


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1] (broadcasts over tokens); [B, T] unchanged."""
    adv = advantages.detach().to(like.dtype)
    if adv.dim() == 1:
        adv = adv[:, None]
    if adv.shape[0] != like.shape[0] or adv.shape[1] not in (1, like.shape[1]):
        raise ValueError(f"advantages {tuple(advantages.shape)} do not match logp {tuple(like.shape)}: "
                         f"pass [batch] or [batch, seq]")
    return adv


def _frac(sel: torch.Tensor, of: torch.Tensor) -> float:
    return int(sel.sum()) / max(int(of.sum()), 1)


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return float(x[m].double().mean()) if bool(m.any()) else float("nan")
