"""ESPO, Entropy importance Sampling Policy Optimization (CompassMax §2.4.2, Eqs. 1-3).

Between token-level PPO/GRPO (one ratio per token: noisy under train-infer mismatch) and GSPO
(one ratio per sequence: every token treated the same), ESPO splits each sequence into
entropy-coherent token groups τ and gives each group its own length-normalised ratio:

    s_τ  = (π_θ(y_τ|x) / π_old(y_τ|x)) ^ (1/|y_τ|)                          (Eq. 2)
    s_τ^t = sg[s_τ] · π_θ(y_t) / sg[π_old(y_t)]                              (Eq. 1, as printed)
    ε_τ  = α / |τ| · Σ_{t∈τ} e_t / log|V|                                    (Eq. 3)
    J    = mean_i  mean_τ  mean_{t∈τ}  min(s_τ^t A_t, clip(s_τ^t, 1-ε_τ, 1+ε_τ) A_t)

Eq. 1 as printed divides by sg[π_old], so its value is s_τ·r_t (the ratio counted twice). GSPO's
token form, which Eq. 1 follows in shape, divides by sg[π_θ]: value s_τ, gradient of log π_θ(y_t).
``EspoConfig.token_denominator`` picks: "current" (default, GSPO-token composition: each group
shares one ratio value, as CompassMax Fig. 4 shows) or "old" (Eq. 1 literally).

Grouping (the paper says only "tokens are grouped by their entropy values; high-entropy tokens are
assigned independent importance sampling rates", citing the 80/20 high-entropy-token rule):
* "top_fraction" (default): the ceil(ρ·n) highest-entropy tokens of a sequence are singleton
  groups (token-level ratios), the rest form one group (a sequence-level ratio); ρ = 0.2 after the
  80/20 rule. ρ = 1 is token-level PPO, ρ = 0 is GSPO.
* "quantile": K equal-count entropy bins per sequence (rank·min(K, n) // n). K = 1 is GSPO,
  K >= length is token-level PPO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from minirl.algorithms.losses import MAX_LOG_RATIO, register_policy_loss

GROUPINGS = ("top_fraction", "quantile")


@dataclass(frozen=True)
class EspoConfig:
    grouping: str = "top_fraction"
    """rule above; "top_fraction" follows the 80/20 high-entropy-token finding cited in §2.4.2."""
    top_fraction: float = 0.2
    """ρ: share of a sequence's tokens (highest entropy) that get their own ratio."""
    n_groups: int = 4
    """K for grouping="quantile"."""
    alpha: float = 0.2
    """α of Eq. 3 (the paper gives no value; 0.2 makes a maximal-entropy group clip like PPO's 0.2)."""
    clip_eps: float | None = None
    """None = entropy-adaptive ε_τ (Eq. 3); a number = one fixed ε (ablations, reduction tests)."""
    token_denominator: str = "current"
    """"current" = sg[π_θ] (GSPO-token form), "old" = sg[π_old] (Eq. 1 as printed)."""

    def __post_init__(self) -> None:
        if self.grouping not in GROUPINGS:
            raise ValueError(f"grouping={self.grouping!r}; valid: {GROUPINGS}")
        if not 0 <= self.top_fraction <= 1 or self.n_groups < 1 or self.alpha < 0:
            raise ValueError("need 0 <= top_fraction <= 1, n_groups >= 1, alpha >= 0")
        if self.token_denominator not in ("current", "old"):
            raise ValueError(f"token_denominator={self.token_denominator!r}; valid: 'current', 'old'")


def entropy_groups(entropy: torch.Tensor, mask: torch.Tensor, cfg: EspoConfig) -> torch.Tensor:
    """entropy, mask [B, T] -> group id per token [B, T] long in [0, T] (padding: 0, unused)."""
    e = entropy.detach().masked_fill(~mask, float("-inf"))  # padding ranks last
    order = e.argsort(dim=1, descending=True, stable=True)  # [B, T] highest entropy first
    positions = torch.arange(e.shape[1], device=e.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)  # [B, T] 0 = highest entropy
    n = mask.sum(1, keepdim=True)  # [B, 1] valid tokens
    if cfg.grouping == "quantile":
        # K >= n already gives every token its own bin; capping K at n keeps that partition and
        # keeps ids below n <= T, inside the row's T + 1 slots (rank·K // n would spill past them)
        k = n.clamp(max=cfg.n_groups)  # [B, 1]
        return torch.where(mask, rank * k // n.clamp(min=1), 0)
    n_top = _top_count(n, cfg.top_fraction)  # [B, 1]
    return torch.where(mask & (rank < n_top), rank + 1, 0)  # 0 = the shared low-entropy group


def _top_count(n_valid: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """ceil(ρ·n) per row, exactly: ρ is read as the decimal it was written as (0.3 is 3/10), so
    ρ = 0.3, n = 50 gives 15. In floating point 0.3·50 can land just above 15 (float32 does) and
    the ceiling then adds a whole token. n_valid: integer tensor -> same shape, long."""
    rho = Fraction(str(top_fraction))
    counts = [math.ceil(rho * n) for n in n_valid.flatten().tolist()]
    return torch.tensor(counts, dtype=torch.long, device=n_valid.device).view(n_valid.shape)


def espo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              entropy: torch.Tensor, mask: torch.Tensor, vocab_size: int,
              cfg: EspoConfig = EspoConfig()) -> tuple[torch.Tensor, dict[str, float]]:
    """-J_ESPO and metrics. logp (grad), old_logp, entropy (nats, of π_old), mask: [B, T];
    advantages: [B] (one per sequence, GRPO) or [B, T]."""
    if not (logp.shape == old_logp.shape == entropy.shape == mask.shape) or logp.dim() != 2:
        raise ValueError(f"logp, old_logp, entropy, mask must all be [B, T]; got {tuple(logp.shape)}, "
                         f"{tuple(old_logp.shape)}, {tuple(entropy.shape)}, {tuple(mask.shape)}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size}: Eq. 3 divides by log|V|, need |V| >= 2")
    b, t = logp.shape
    mask = mask.bool()
    m = mask.to(logp.dtype)
    adv = advantages[:, None].expand(b, t) if advantages.dim() == 1 else advantages  # [B, T]
    g = t + 1  # group ids per sequence are in [0, T]
    row_start = torch.arange(b, device=logp.device)[:, None] * g  # [B, 1]
    slot = entropy_groups(entropy, mask, cfg) + row_start  # [B, T] in [0, B*G)
    slot = torch.where(mask, slot, b * g)  # padding -> a trash slot

    def per_group(x: torch.Tensor) -> torch.Tensor:  # [B, T] -> per-slot sums [B*G + 1]
        sums = torch.zeros(b * g + 1, dtype=x.dtype, device=x.device)
        return sums.scatter_add(0, slot.flatten(), (x * m).flatten())

    count = per_group(torch.ones_like(m))  # [B*G + 1] tokens per group
    log_s = per_group(logp - old_logp) / count.clamp(min=1)  # [B*G + 1] log of Eq. 2
    denom = logp if cfg.token_denominator == "current" else old_logp
    log_ratio = log_s[slot].detach() + logp - denom.detach()  # [B, T] log of Eq. 1
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # finite in float32 (losses.py)
    if cfg.clip_eps is None:
        eps = (cfg.alpha * per_group(entropy.detach()) / count.clamp(min=1) / math.log(vocab_size))[slot]
    else:
        eps = torch.full_like(ratio, cfg.clip_eps)  # [B, T]
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    obj = torch.minimum(ratio * adv, clipped * adv)  # [B, T]
    group_mean = (per_group(obj) / count.clamp(min=1))[: b * g].view(b, g)  # [B, G] per group
    present = count[: b * g].view(b, g) > 0  # [B, G]
    n_groups = present.sum(1)  # [B]
    seq_obj = (group_mean * present).sum(1) / n_groups.clamp(min=1)  # [B]
    has_tokens = n_groups > 0
    loss = -seq_obj[has_tokens].mean()
    with torch.no_grad():
        metrics = {
            "espo/loss": float(loss.detach()),
            "espo/clip_frac": float(((ratio - clipped).abs() > 0)[mask].float().mean()),
            "espo/eps_mean": float(eps[mask].mean()),
            "espo/groups_per_seq": float(n_groups[has_tokens].float().mean()),
            "espo/abs_log_ratio": float(log_s[slot][mask].abs().mean()),
        }
    return loss, metrics


@register_policy_loss("espo", grouping="espo_grouping", top_fraction="espo_top_fraction", n_groups="espo_n_groups",
                      alpha="espo_alpha", clip_eps="espo_clip_eps", token_denominator="espo_token_denominator")
def espo_policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     entropy_old: torch.Tensor, vocab_size: int, grouping: str = "top_fraction",
                     top_fraction: float = 0.2, n_groups: int = 4, alpha: float = 0.2, clip_eps: float | None = None,
                     token_denominator: str = "current") -> tuple[torch.Tensor, dict[str, float]]:
    """``espo_loss`` as ``loss: espo``: the positional inputs of every policy loss, the options as
    plain values, ``pg_loss`` like the others, and metric names without ``/`` (metrics.nc columns)."""
    cfg = EspoConfig(grouping, top_fraction, n_groups, alpha, clip_eps, token_denominator)
    loss, m = espo_loss(logp, logp_old, advantages, entropy_old, mask, vocab_size, cfg)
    return loss, {"pg_loss": float(loss.detach()), **{k.replace("/", "_"): v for k, v in m.items()}}
