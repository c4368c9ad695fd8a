"""Token logprobs and entropy straight from hidden states and the lm_head weight.

Why fused/chunked: ``log_softmax(h @ W.T)`` materialises ``[N, V]`` logits several times
(logits, fp32 copy, log-probs, probabilities, and their gradients). At V = 151,936 (Qwen) and
a few thousand tokens that dominates the RL trainer's memory. The chunked variants process
``chunk_size`` rows at a time and recompute the chunk's logits in backward, so peak memory is
O(chunk_size * V) instead of O(N * V).

Call contract: ``logprobs(hidden[N, H], weight[V, H], targets[N], *, temperature=1.0,
chunk_size=None, softcap=None) -> (logprob[N], entropy[N])``. The GEMM runs in the inputs' dtype (a bf16
GEMM rounds the logits to bf16, like ``nn.Linear`` would); everything after it (the soft-cap
``tanh(z / softcap) * softcap`` that Gemma 2/3 apply after ``lm_head``, scaling by
1/temperature, log-softmax, entropy) runs in fp32 — float64 when the inputs are float64, so
``gradcheck`` can run — and the outputs have that dtype. A model's linear logit scale (Granite's
``1 / logits_scaling``, Cohere's ``logit_scale``) is a temperature of ``1 / scale``.
"""

from __future__ import annotations

import torch

from . import _checks, _triton
from .registry import register

#: A chunk's fp32 logits take about this many elements (32 MiB) unless ``chunk_size`` is given.
CHUNK_ELEMENTS = 1 << 23


def check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
          softcap: float | None = None) -> None:
    """Shared argument validation (the Triton wrapper uses it too); skipped under ``trusted()``."""
    if _checks.skipped():
        return
    if softcap is not None:
        _checks.positive("softcap", softcap)
    _checks.floating("hidden", hidden)
    _checks.floating("weight", weight)
    _checks.ndim("hidden", hidden, 2, "[N, H]")
    _checks.ndim("weight", weight, 2, "[V, H]")
    _checks.integer("targets", targets)
    _checks.ndim("targets", targets, 1, "[N]")
    _checks.dim_matches("hidden", hidden, 1, "weight", weight, 1)
    _checks.dim_matches("hidden", hidden, 0, "targets", targets, 0)
    if hidden.dtype != weight.dtype:
        raise TypeError(f"dtype mismatch: {_checks.describe('hidden', hidden)} vs {_checks.describe('weight', weight)}")
    _checks.same_device(hidden=hidden, weight=weight, targets=targets)
    _checks.positive("temperature", temperature)
    vocab = weight.shape[0]
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        # the fused kernel would silently read logit 0 for an out-of-range id
        raise ValueError(f"{_checks.describe('targets', targets)} must lie in [0, V={vocab})")


def chunk_rows(n_vocab: int, chunk_size: int | None) -> int:
    """Rows per chunk: ``chunk_size`` if given, else about ``CHUNK_ELEMENTS / V`` rows."""
    if chunk_size is None:
        return max(1, CHUNK_ELEMENTS // max(n_vocab, 1))
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float,
                 softcap: float | None = None) -> torch.Tensor:
    """``(h @ W.T)`` in the inputs' dtype, then fp32 (float64), soft-capped when ``softcap`` is
    given and divided by temperature; [c, V]."""
    return capped_logits(h, weight, temperature, softcap)[0]


def capped_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, softcap: float | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``chunk_logits`` and, with a soft-cap, ``d capped / d raw = 1 - tanh(raw / softcap)²``
    (the backward's chain rule through the cap); None without one. The fp32 result is a fresh
    tensor the caller may overwrite (temperature 1 divides nothing: no pass over ``[c, V]``)."""
    z = (h @ weight.T).to(_checks.compute_dtype(h.dtype))
    if softcap is None:
        return (z if temperature == 1.0 else z.div_(temperature)), None
    t = (z / softcap).tanh()
    return t * softcap / temperature, 1 - t * t


@register("logprobs", "naive")
def naive(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(h @ W.T / T)`` over the full ``[N, V]`` logits, autograd through all of it.

    Who: what most RL trainers do by default (HF logits -> ``log_softmax`` -> gather; verl's
    non-fused path). Numerically the yardstick for ``chunked``; memory-wise the thing to beat.
    ``chunk_size`` is accepted and ignored so variants are interchangeable.
    """
    check(hidden, weight, targets, temperature, softcap)
    logp = torch.log_softmax(chunk_logits(hidden, weight, temperature, softcap), dim=-1)  # [N, V]
    token_logp = logp.gather(1, targets[:, None].long()).squeeze(1)  # [N]
    entropy = -(logp.exp() * logp).sum(-1)  # [N]
    return token_logp, entropy


def torch_forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, rows: int,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked forward: ``(logprob[N], entropy[N], logsumexp[N])``, ``rows`` rows at a time."""
    compute = _checks.compute_dtype(hidden.dtype)
    n = hidden.shape[0]
    token_logp = torch.empty(n, dtype=compute, device=hidden.device)
    entropy = torch.empty_like(token_logp)
    lse = torch.empty_like(token_logp)
    for start in range(0, n, rows):
        sl = slice(start, start + rows)
        logp = chunk_logits(hidden[sl], weight, temperature, softcap)  # [c, V] logits, then in place:
        lse[sl] = torch.logsumexp(logp, dim=-1)
        logp.sub_(lse[sl, None])  # log-probs
        token_logp[sl] = logp.gather(1, targets[sl, None].long()).squeeze(1)
        entropy[sl] = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy, lse


class ChunkedLogprobs(torch.autograd.Function):
    """Autograd with recomputation: only ``hidden``, ``weight``, ``targets`` and three ``[N]``
    vectors are saved; backward rebuilds the logits a block of vocabulary columns at a time.

    Gradients, with ``p = softmax(z)``, ``z = logits / T``:
    ``d logp_t / dz = onehot(t) - p`` and ``d entropy / dz = -p * (log p + entropy)`` (skipped when
    no entropy gradient arrives, the RL trainer's case: its entropy is a logged diagnostic).
    The backward walks the vocabulary in column blocks of about ``rows * V`` elements (the
    forward's chunk): each block's ``grad_W`` rows are then one complete GEMM over all N tokens,
    written once in the weight's dtype from the logits' gradient cast to the inputs' dtype, as
    autograd of a bf16 ``h @ W.T`` rounds it; ``grad_h`` [N, H] accumulates over blocks in fp32.
    (Row chunks instead summed per-chunk ``grad_W`` pieces into an fp32 ``[V, H]``: a skinny GEMM
    and a full-size cast per chunk, 1.2 of smollm2's 1.5 s logprob forward + backward.)
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, rows: int, softcap: float | None = None):
        token_logp, entropy, lse = torch_forward(hidden, weight, targets, temperature, rows, softcap)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.temperature, ctx.rows, ctx.softcap = temperature, rows, softcap
        ctx.set_materialize_grads(False)  # an unused entropy's gradient arrives as None, not zeros
        return token_logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_h = torch.zeros(hidden.shape, dtype=lse.dtype, device=hidden.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        g_lp = torch.zeros_like(lse) if grad_logp is None else grad_logp
        targets = targets.long()
        cols = max(1, ctx.rows * vocab // max(n, 1))
        for v0 in range(0, vocab, cols):
            block = slice(v0, min(vocab, v0 + cols))
            z, cap_grad = capped_logits(hidden, weight[block], ctx.temperature, ctx.softcap)  # [N, c]
            logp = z.sub_(lse[:, None])
            if grad_entropy is None:
                grad_z = logp.exp_().mul_(-g_lp[:, None])  # -p * g_lp, in place
            else:
                grad_z = (logp + entropy[:, None]).mul_(grad_entropy[:, None]).add_(g_lp[:, None])
                grad_z.mul_(logp.exp_()).neg_()  # -p * (g_lp + g_ent * (log p + entropy))
            # + onehot(t) * g_lp where t falls in this block (elsewhere 0 is added): no host sync
            inside = (targets >= block.start) & (targets < block.stop)
            column = (targets - block.start).clamp_(0, z.shape[1] - 1)
            grad_z.scatter_add_(1, column[:, None], torch.where(inside, g_lp, 0.0)[:, None].to(grad_z.dtype))
            if cap_grad is not None:
                grad_z.mul_(cap_grad)
            if ctx.temperature != 1.0:
                grad_z.div_(ctx.temperature)
            grad_z = grad_z.to(hidden.dtype)  # d loss / d (h @ W[block].T), [N, c]
            if need_h:
                grad_h += (grad_z @ weight[block]).to(grad_h.dtype)
            if need_w:
                torch.mm(grad_z.T, hidden, out=grad_w[block])
        return (grad_h.to(hidden.dtype) if need_h else None), grad_w, None, None, None, None


@register("logprobs", "chunked")
def chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-chunked logprobs/entropy with recompute-in-backward (peak memory O(chunk * V)).

    Who: the memory trick of fused linear-cross-entropy losses (Liger, verl
    ``use_fused_kernels``, Megatron vocab-chunked loss) applied to logprob + entropy. Same
    numerics as ``naive`` (same GEMM dtype, fp32 softmax) up to reduction order.
    """
    check(hidden, weight, targets, temperature, softcap)
    rows = chunk_rows(weight.shape[0], chunk_size)
    return ChunkedLogprobs.apply(hidden, weight, targets, temperature, rows, softcap)


@register("logprobs", "chunked", impl="triton")
def chunked_triton(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton kernels computing ``chunked``: a split-vocabulary fused forward (tiled GEMM + online
    log-sum-exp + entropy, merged across programs) and a backward that recomputes logit tiles.

    Who: Liger's fused linear cross-entropy and Apple's Cut Cross-Entropy do this for the loss;
    this one returns logprob *and* entropy with both gradients (RL needs both). The tile GEMM
    accumulates in fp32 and rounds each logit to the input dtype like a cuBLAS GEMM output, so
    it matches ``chunked`` up to accumulation order. ``chunk_size`` sets the rows of the
    backward's logit-gradient buffer (default: 256 MiB of it). Design: kernels/triton_logprobs.py.
    It has no soft-cap: ``softcap`` is refused (the torch ``chunked`` computes it).
    """
    if softcap is not None:
        raise NotImplementedError(f"the Triton logprobs kernel has no logit soft-cap (softcap={softcap}, Gemma 2/3); "
                                  f"use kernels.get('logprobs', 'chunked', impl='torch'), which applies it")
    check(hidden, weight, targets, temperature)
    if chunk_size is not None:
        chunk_rows(weight.shape[0], chunk_size)  # validates it
    mod = _triton.load("triton_logprobs", hidden)
    return mod.FusedLogprobs.apply(hidden, weight, targets, temperature, chunk_size)
