"""Sampling parameters and the batched sampler.

Why inverse-CDF sampling with counter-based uniforms instead of ``torch.multinomial`` with a
generator: the uniform of rollout ``i`` at decode step ``t`` is a pure function of ``(seed, i, t)``,
so a seeded generate is reproducible, a sequence's samples do not depend on which other
sequences share the batch or finish early, and the whole batch is sampled in a few tensor ops
(no per-sequence Python loop). The token is the first whose cumulative probability reaches
``u``: an exact sample of the fp32 probabilities ``exp(log_softmax(z))`` (the log-probabilities
the engine returns, exponentiated), the cumulative sums in float64 so that a token's interval is
its fp32 probability to ~1e-16. One draw per row, not one per vocabulary entry: the Gumbel-max
sampler this replaced hashed a [B, V] int64 tensor every step (40 of 56 ms a step at 32 x 49,152
on one core, docs/measurements/2026-12-02-sampler.md). The search is two-level (``BLOCK``): a
float64 sum per block of the vocabulary, then a cumulative sum inside the one block drawn, so a
step makes one float64 pass over [B, V] instead of a softmax, a float64 copy and a full
cumulative sum (docs/measurements/2026-12-03-sampler-blocks.md).

Non-finite logits are a finding about the model, not a crash: a row holding NaN or +inf, or with
no token of positive mass, fails the step with ``NonFiniteLogitsError`` naming the rows (for RL
every rollout of a batch must be sound, so the batch fails, not just the row).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

_F32 = torch.finfo(torch.float32)
"""The sampler computes in float32: a temperature or top_p it cannot hold is refused up front."""


class NonFiniteLogitsError(ValueError):
    """Logits no token can be drawn from. A ``ValueError`` so that ``mlab`` reports it as one line
    (exit 2); a class of its own so that a caller can tell a broken model from a bad argument."""


@dataclass(frozen=True)
class SamplingParams:
    """What to sample. Validated on construction so a bad value fails where it was written."""

    n: int = 1
    """samples per prompt; rollouts come back prompt-major (p0s0, p0s1, ..., p1s0, ...)."""
    temperature: float = 1.0
    """0 = greedy; >0 divides the logits."""
    top_p: float = 1.0
    """nucleus mass in (0, 1]; 1 disables."""
    top_k: int = 0
    """keep the k largest logits; 0 (or -1, vLLM's spelling) disables."""
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    """extra ids that end a sequence (included in its tokens); the model's eos ids always stop
    unless ``ignore_eos``."""
    ignore_eos: bool = False
    seed: int | None = None
    """None draws one from torch's global RNG (so ``torch.manual_seed`` makes it repeatable)."""
    return_processed_logprobs: bool = False
    """also return logprobs under the processed (temperature/top-k/top-p) distribution."""

    def __post_init__(self) -> None:
        for name in ("n", "top_k", "max_new_tokens"):
            _require_int(name, getattr(self, name))
        if self.seed is not None:
            _require_int("seed", self.seed)
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r}: must be a finite number")
        for t in self.stop_token_ids:
            _require_int("stop_token_ids entry", t)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.n < 1:
            raise ValueError(f"n={self.n}: need at least one sample per prompt (n >= 1)")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} < 0: use 0 for greedy or a positive value")
        if 0 < self.temperature < _F32.tiny or self.temperature > _F32.max:
            raise ValueError(f"temperature={self.temperature!r} is outside float32's range [{_F32.tiny:.4g}, "
                             f"{_F32.max:.4g}], where the sampler divides the logits: use 0 for greedy or a value "
                             f"in that range (the trainer's floor is 0.01)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} outside (0, 1]: use 1.0 to disable nucleus sampling")
        if self.top_p < _F32.tiny:  # float32 rounds it to 0, which would drop every token
            raise ValueError(f"top_p={self.top_p!r} is below float32's smallest normal number {_F32.tiny:.4g}, "
                             f"where the sampler compares it: use a value in [{_F32.tiny:.4g}, 1]")
        if self.top_k < -1:
            raise ValueError(f"top_k={self.top_k}: use a positive k, or 0 / -1 to disable")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")


def _require_int(name: str, value: object) -> None:
    """Integers only: ``max_new_tokens=2.5`` or ``n=True`` is a mistake, not a value to round."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an int, not {type(value).__name__}")


_U64 = 1 << 64


def _i64(c: int) -> int:
    c %= _U64
    return c - _U64 if c >= 1 << 63 else c


_GOLDEN, _M1, _M2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s).bitwise_and_((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer on int64 tensors (wrapping arithmetic), in place on one fresh tensor."""
    x = x + _GOLDEN
    x.bitwise_xor_(_srl(x, 30)).mul_(_M1)
    x.bitwise_xor_(_srl(x, 27)).mul_(_M2)
    return x.bitwise_xor_(_srl(x, 31))


@functools.lru_cache(maxsize=16)
def _row_keys(seed: int, rows: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The step-independent part of the random key of each row, [B] int64 on ``device``
    (read-only). Cached: a generate asks for the same rows every decode step, so each step
    mixes once, not three times, and copies nothing to the device."""
    seeds = torch.full((len(rows),), _i64(seed), dtype=torch.long, device=device)
    return _mix(_mix(seeds) ^ torch.tensor(rows, dtype=torch.long, device=device))


def uniforms(seed: int, rows: torch.Tensor, step: int, device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """U(0, 1) [B] float64 on ``device``, a pure function of (seed, rows[b], step) whatever the
    device (integer mixing is exact everywhere; ``rows`` is read on the host): 53 random bits, so
    every float64 in (0, 1) that a draw can take is equally likely."""
    bits = _mix(_row_keys(seed, tuple(rows.tolist()), torch.device(device)) ^ step)  # [B]
    return _srl(bits, 11).double().add_(0.5).mul_(2.0 ** -53)


def sample(logits: torch.Tensor, params: SamplingParams, seed: int, rows: torch.Tensor,
           step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """logits [B, V] -> (token ids [B], raw logprobs [B] fp32, processed logprobs [B] or None),
    on the logits' device; ``rows`` [B] (the rollout ids, seeding the draws) stays on the host.

    Raw = log_softmax of the model's logits (pre temperature/top-k/top-p), what the
    trainer's forward computes; processed = under the distribution actually sampled from.
    Raises ``NonFiniteLogitsError`` naming the rows (``rows``' ids) no token can be drawn from.
    """
    if logits.shape[-1] == 0:  # a model with vocab_size 0: no token to draw (torch's reductions raise IndexError)
        raise ValueError(f"sampling step {step}: the logits have shape {list(logits.shape)}, a vocabulary of 0 "
                         f"tokens, so there is no token to draw; check the model's vocab_size (its config.json)")
    z = plain = logits.float()  # [B, V]
    _check_rows(z, params.temperature, rows, step, logits.dtype)
    raw = z.log_softmax(-1)
    if params.temperature == 0:
        tokens = z.argmax(-1)
        processed = torch.zeros(tokens.shape, device=z.device) if params.return_processed_logprobs else None
        return tokens, raw.gather(1, tokens[:, None])[:, 0], processed
    if params.temperature != 1:  # z / 1 == z exactly: skip a [B, V] op in the common case
        z = z / params.temperature
    if params.top_k > 0 and params.top_k < z.shape[-1]:
        kth = z.topk(params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        z = z.masked_fill(z < kth, float("-inf"))
    if params.top_p < 1:
        sorted_z, idx = z.sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop = torch.zeros_like(z, dtype=torch.bool).scatter(1, idx, mass_before >= params.top_p)
        z = z.masked_fill(drop, float("-inf"))
    logp = raw if z is plain else z.log_softmax(-1)  # [B, V] the distribution sampled from
    tokens = inverse_cdf(logp.exp(), uniforms(seed, rows, step, z.device))  # a masked token weighs an exact 0
    processed = logp.gather(1, tokens[:, None])[:, 0] if params.return_processed_logprobs else None
    return tokens, raw.gather(1, tokens[:, None])[:, 0], processed


def _check_rows(z: torch.Tensor, temperature: float, rows: torch.Tensor, step: int,
                dtype: torch.dtype = torch.float32) -> None:
    """Refuse the rows of ``z`` [B, V] that cannot be sampled, before ``inverse_cdf`` would index
    past the vocabulary. On the decode hot path, so one reduction and one host read of a flag:
    a row's max (amax propagates NaN) is NaN if the row holds a NaN, +inf if it holds +inf, -inf
    if every entry is -inf, and max / temperature overflows exactly when the tempered row does;
    -inf entries beside a finite one (masks) are fine. Rows are described only on failure; ``dtype``
    is the model's logits dtype, which the fix names (fp16 overflows where bf16 does not)."""
    top = z.amax(-1)  # [B]
    scaled = top if temperature in (0, 1) else top / temperature  # the same op as ``sample``'s
    if not bool(torch.isfinite(scaled).all()):
        raise NonFiniteLogitsError(_describe(top.tolist(), scaled.tolist(), temperature, rows.tolist(), step, dtype))


def _describe(top: list[float], scaled: list[float], temperature: float, rows: list[int], step: int,
              dtype: torch.dtype = torch.float32) -> str:
    """The refusal: which rows, what is wrong with each, and what to do about it."""
    bad: dict[str, list[int]] = {}
    for r, m, s in zip(rows, top, scaled):
        if not math.isfinite(s):
            bad.setdefault(_what(m, temperature), []).append(r)
    parts = "; ".join(f"the logits of rows {_some(ids)} {what}" for what, ids in bad.items())
    fixes = []
    if any(not math.isfinite(m) for m in top):
        if dtype == torch.float16:  # Gemma 3's activations pass fp16's 65504 on the first forward
            fixes.append("the model overflowed float16 (largest finite value 65504), which some models' "
                         "activations exceed (Gemma 3): run the engine in bfloat16 (same range as float32)")
        fixes.append("the model produced NaN/inf: check its weights (e.g. `mlab check`) or lower the learning rate")
    if any(math.isfinite(m) and not math.isfinite(s) for m, s in zip(top, scaled)):
        fixes.append("raise the temperature, or use 0 for greedy")
    return f"sampling step {step}: {parts}: {'; '.join(fixes)}"


def _what(top: float, temperature: float) -> str:
    """What is wrong with a row whose largest logit is ``top``."""
    if math.isnan(top):
        return "are not finite (NaN)"
    if top == math.inf:
        return "are not finite (+inf, an overflow)"
    if top == -math.inf:
        return "are all -inf (no token has mass)"
    return f"overflow float32 once divided by temperature={temperature!r} (largest logit {top:.4g})"


def _some(ids: list[int], limit: int = 10) -> str:
    return f"{ids[:limit]}" + (f" (and {len(ids) - limit} more)" if len(ids) > limit else "")


BLOCK = 1024
"""Vocabulary entries per block of the two-level search (``inverse_cdf``): 48 blocks at 49,152."""


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [B, V] >= 0 fp32 (each row's sum > 0), u [B] float64 in (0, 1) -> per row the first
    token whose float64 cumulative weight reaches ``u`` times the row's total. A token of weight
    0 is never returned: the block searched has a positive sum (the first block whose cumulative
    sum reaches a positive target), and inside it the target is capped at the block's own
    cumulative total, which the last positive token of the block first reaches; ``u`` of 1 gives the
    row's last positive token. Outside the preconditions (an internal function: ``uniforms`` never
    gives 0 or 1, ``sample`` refuses a row with no positive weight first, and its weights are
    probabilities) the result is an index in [0, V) but unspecified: ``u`` of 0 and an all-zero row
    give token 0, whatever its weight."""
    b, v = weights.shape
    full = v // BLOCK * BLOCK
    sums = [weights[:, :full].view(b, -1, BLOCK).sum(-1, dtype=torch.float64)] if full else []  # [B, v // BLOCK]
    if full < v:
        sums.append(weights[:, full:].sum(-1, keepdim=True, dtype=torch.float64))  # the short last block
    ends = torch.cat(sums, dim=1).cumsum_(-1)  # [B, nb] cumulative weight at each block's end
    target = u[:, None] * ends[:, -1:]  # [B, 1], scaled by the total's own rounding
    block = torch.searchsorted(ends, target).clamp_(max=ends.shape[1] - 1)  # [B, 1]
    before = torch.where(block > 0, ends.gather(1, (block - 1).clamp_(min=0)), 0.0)  # [B, 1]
    cols = block * BLOCK + torch.arange(BLOCK, device=weights.device)  # [B, BLOCK]
    inside = weights.gather(1, cols.clamp(max=v - 1)).masked_fill_(cols >= v, 0.0)  # [B, BLOCK]
    cum = inside.double().cumsum_(-1)  # [B, BLOCK]
    offset = torch.minimum(target - before, cum[:, -1:])  # [B, 1]
    return cols.gather(1, torch.searchsorted(cum, offset))[:, 0]
