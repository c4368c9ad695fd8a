"""Train-inference mismatch corrections: per-token weights from pi_train / pi_infer.

The rollout engine samples from ``pi_infer``; the trainer's forward on the same weights gives
``pi_train``. They differ (precision, kernels, routing), so the policy gradient is off-policy
by ``rho = pi_train(y_t) / pi_infer(y_t)``. Each function here turns ``rho`` into loss
weights; the caller multiplies the per-token policy loss by them.

Contract, shared by every function: inputs ``logp_train``, ``logp_infer`` float [B, T] and a
0/1 ``mask`` [B, T] (1 = a generated token that counts in the loss). ``rho`` is computed in
log space and detached (the correction is a constant of the update, Ring-1T §2.3.2 eq. 3).
Returns ``(weights [B, T] float32, mask [B, T], metrics: dict[str, float])``. The mask comes
back *unchanged*: a rejected token gets weight 0 but stays in the loss denominator
(Ring-1T §2.3.2 eq. 1 divides by |y_i| whatever ``M`` says).

Levels: ``token`` (one rho per token), ``sequence`` (rho_seq = prod_t rho_t, the exact
sequence likelihood ratio), ``geometric`` (exp(mean_t log rho_t), length-normalised).

``TrainConfig.correction`` names one of ``CORRECTIONS``; a new one is a function here with the same
contract, decorated ``@register_correction(name, param="config_field", ...)`` (docs/rl.md, "Adding a
correction").
"""

from __future__ import annotations

import torch

from minirl.algorithms.registry import Registry

LEVELS = ("token", "sequence", "geometric")
CORRECTIONS = Registry("correction")
register_correction = CORRECTIONS.register


@register_correction("icepop", alpha="icepop_alpha", beta="icepop_beta")
def icepop(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor,
           alpha: float = 0.5, beta: float = 5.0) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """IcePop (Ring-1T §2.3.2 eq. 2; alpha=0.5, beta=5 from §2.3.4): ``M(rho) = rho`` if
    ``rho in [alpha, beta]`` else 0. Tokens outside the band are discarded from the gradient
    (unlike TIS, which keeps them with a capped weight) but still count in the denominator."""
    _check_band("icepop", "alpha", alpha, "beta", beta)
    log_rho, mask = _log_rho(logp_train, logp_infer, mask)
    rho = log_rho.exp()
    keep = (rho >= alpha) & (rho <= beta)
    weights = torch.where(keep, rho, torch.zeros_like(rho)) * mask
    metrics = mismatch_metrics(logp_train, logp_infer, mask)
    metrics.update(_band_metrics(rho, mask, alpha, beta, weights))
    return weights, mask, metrics


@register_correction("tis", level="correction_level", cap="tis_cap")
def tis(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor,
        level: str = "token", cap: float = 2.0) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Truncated importance sampling (Yao et al. 2025, the TIS baseline of Ring-1T §2.4.1):
    ``w = min(rho, C)``. ``level="sequence"`` truncates the sequence ratio ``prod_t rho_t``."""
    if level not in ("token", "sequence"):
        raise ValueError(f"tis level={level!r}; valid: 'token', 'sequence'")
    if not cap > 0:
        raise ValueError(f"tis cap={cap}: the truncation C must be > 0 (typical: 2.0)")
    log_rho, mask = _log_rho(logp_train, logp_infer, mask)
    rho = _level_ratio(log_rho, mask, level).exp()
    weights = rho.clamp(max=cap) * mask
    metrics = mismatch_metrics(logp_train, logp_infer, mask)
    metrics.update(_band_metrics(rho, mask, 0.0, cap, weights))
    return weights, mask, metrics


@register_correction("mis", level="correction_level", low="mis_low", high="mis_high")
def mis(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor,
        level: str = "token", low: float = 0.5, high: float = 2.0
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Masked importance sampling: ``w = rho`` inside ``[low, high]``, 0 outside (rejection).
    At ``sequence``/``geometric`` level a whole sequence is rejected at once."""
    if level not in LEVELS:
        raise ValueError(f"mis level={level!r}; valid: {', '.join(map(repr, LEVELS))}")
    _check_band("mis", "low", low, "high", high)
    log_rho, mask = _log_rho(logp_train, logp_infer, mask)
    rho = _level_ratio(log_rho, mask, level).exp()
    keep = (rho >= low) & (rho <= high)
    weights = torch.where(keep, rho, torch.zeros_like(rho)) * mask
    metrics = mismatch_metrics(logp_train, logp_infer, mask)
    metrics.update(_band_metrics(rho, mask, low, high, weights))
    return weights, mask, metrics


@register_correction("none")
def no_correction(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """No correction (vanilla GRPO; also what "bypass" needs, Ring-linear §5.2.2 eq. 5, where
    pi_old *is* pi_infer so rho = 1): unit weights, the mismatch still measured."""
    log_rho, mask = _log_rho(logp_train, logp_infer, mask)
    weights = mask.clone()
    metrics = mismatch_metrics(logp_train, logp_infer, mask)
    metrics.update(_band_metrics(log_rho.exp(), mask, 0.0, float("inf"), weights))
    return weights, mask, metrics


def mismatch_metrics(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far apart the engines are on the sampled tokens (Ring-1T Fig. 6 and 11).

    ``mismatch_kl_k1`` / ``_k3`` estimate KL(pi_infer || pi_train) from samples of pi_infer:
    k1 = -log rho, k3 = rho - 1 - log rho (unbiased, always >= 0)."""
    m = mask.to(torch.float64)
    n = m.sum().clamp(min=1.0)
    log_rho = (logp_train.detach().double() - logp_infer.detach().double()) * m  # [B, T]
    abs_diff = log_rho.abs()
    prob_diff = (logp_train.detach().double().exp() - logp_infer.detach().double().exp()).abs() * m
    return {
        "mismatch_kl_k1": float((-log_rho).sum() / n),
        "mismatch_kl_k3": float(((log_rho.exp() - 1 - log_rho) * m).sum() / n),
        "abs_dlogp_max": float(abs_diff.max()) if m.any() else 0.0,
        "abs_dlogp_mean": float(abs_diff.sum() / n),
        "abs_dprob_max": float(prob_diff.max()) if m.any() else 0.0,
    }


def masked_token_stats(weights: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor,
                       entropy: torch.Tensor) -> dict[str, float]:
    """Log-prob and entropy of the tokens a correction zeroed vs all tokens (Ring-1T Fig. 12:
    masked tokens are the high-entropy ones). NaN when no token was zeroed."""
    m = mask.bool()
    zeroed = m & (weights == 0)
    out = {}
    for name, sel in (("all", m), ("masked", zeroed)):
        any_ = bool(sel.any())
        out[f"logp_{name}"] = float(logp.detach()[sel].double().mean()) if any_ else float("nan")
        out[f"entropy_{name}"] = float(entropy.detach()[sel].double().mean()) if any_ else float("nan")
    return out


def _log_rho(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated ``log rho`` [B, T] float32 (0 at masked-out positions) and the mask as float."""
    for name, t in (("logp_train", logp_train), ("logp_infer", logp_infer)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a float tensor [batch, seq], got {type(t).__name__}"
                            + (f" {t.dtype}" if isinstance(t, torch.Tensor) else ""))
        if t.dim() != 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [batch, seq]")
    if logp_train.shape != logp_infer.shape or tuple(mask.shape) != tuple(logp_train.shape):
        raise ValueError(f"shape mismatch: logp_train {tuple(logp_train.shape)}, logp_infer "
                         f"{tuple(logp_infer.shape)}, mask {tuple(mask.shape)}; all must be [batch, seq]")
    mask_f = mask.to(torch.float32)
    log_rho = (logp_train.detach().float() - logp_infer.detach().float()) * mask_f  # [B, T]
    return log_rho, mask_f


def _level_ratio(log_rho: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """``log rho`` at ``level``, broadcast back to [B, T]."""
    if level == "token":
        return log_rho
    total = log_rho.sum(-1, keepdim=True)  # [B, 1]
    if level == "geometric":
        total = total / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return total.expand_as(log_rho)


def _band_metrics(rho: torch.Tensor, mask: torch.Tensor, low: float, high: float,
                  weights: torch.Tensor) -> dict[str, float]:
    """Fractions of valid tokens below / above the band and zeroed, and the normalised
    effective sample size ``(sum w)^2 / (n sum w^2)`` (1 = no reweighting)."""
    m = mask.bool()
    n = max(int(m.sum()), 1)
    w = weights[m].double()
    sq = float((w * w).sum())
    return {
        "frac_clipped_low": int((m & (rho < low)).sum()) / n,
        "frac_clipped_high": int((m & (rho > high)).sum()) / n,
        "frac_masked": int((m & (weights == 0)).sum()) / n,
        "ess": float(w.sum() ** 2 / (n * sq)) if sq > 0 else 0.0,
    }


def _check_band(fn: str, lo_name: str, lo: float, hi_name: str, hi: float) -> None:
    if not 0 <= lo < hi:
        raise ValueError(f"{fn}: need 0 <= {lo_name} < {hi_name}, got {lo_name}={lo}, {hi_name}={hi}; "
                         f"e.g. {lo_name}=0.5, {hi_name}={5.0 if fn == 'icepop' else 2.0}")
