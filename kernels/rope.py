"""Rotary position embedding, neox (rotate-half) and gptj (interleaved) styles, partial rotary.

Ring-linear §5.2.1: "minor discrepancies often exist between a common PyTorch implementation
and a RoPE operator in an inference engine". They come from *where cos/sin come from* (computed
on the fly in fp32 vs read from a cached table stored in the activation dtype) and *which
dtype the rotation arithmetic runs in*. All variants share one rotation core and differ only in
those two choices, so a difference between two variants is attributable to them.

Call contract: ``rope(x[N, heads, head_dim], positions[N], *, theta, rotary_dim,
style="neox"|"gptj")`` -> same shape and dtype. Only the first ``rotary_dim`` dims of each
head are rotated (partial rotary, as Ring-linear/GLM/Phi use); the rest pass through.
Frequencies: ``inv_freq[j] = theta ** (-2j / rotary_dim)``, ``angle = position * inv_freq``.
neox pairs dim ``j`` with ``j + rotary_dim/2``; gptj pairs ``2j`` with ``2j + 1``.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import _checks, _triton
from .registry import register

STYLES = ("neox", "gptj")


def check(x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int, style: str) -> None:
    """Shared argument validation (the Triton wrapper uses it too)."""
    if _checks.skipped():
        return
    _checks.floating("x", x)
    _checks.ndim("x", x, 3, "[N, heads, head_dim]")
    _checks.integer("positions", positions)
    _checks.ndim("positions", positions, 1, "[N]")
    _checks.dim_matches("x", x, 0, "positions", positions, 0)
    _checks.same_device(x=x, positions=positions)
    _checks.positive("theta", theta)
    head_dim = x.shape[-1]
    if not isinstance(rotary_dim, int) or not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be an even int in (0, head_dim={head_dim}], got {rotary_dim!r}")
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")


def inv_freq(theta: float, rotary_dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``1 / theta ** (arange(0, rotary_dim, 2) / rotary_dim)`` in ``dtype`` — transformers' and
    vLLM's formula, op for op, so fp32 frequencies are bit-identical across engines."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=dtype, device=device) / rotary_dim  # [R/2]
    return 1.0 / (theta**exponent)


def angles(positions: torch.Tensor, theta: float, rotary_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``positions[:, None] * inv_freq`` in ``dtype``; [N, R/2]. In fp32 the angle of a long
    position carries an absolute error ~ position * 6e-8 rad — shared by all fp32 engines."""
    return positions.to(dtype)[:, None] * inv_freq(theta, rotary_dim, dtype, positions.device)[None, :]


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, style: str, compute: torch.dtype
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of ``x[N, h, D]`` by per-token ``cos/sin[N, R/2]``.

    Arithmetic runs in ``compute``; the result is rounded once to ``x.dtype``. For neox,
    ``(x1*cos - x2*sin, x2*cos + x1*sin)`` is bit-identical to transformers'
    ``x*cos + rotate_half(x)*sin`` (IEEE negation and ``a + (-b) == a - b`` are exact).
    """
    rot = x[..., :rotary_dim].to(compute)  # [N, h, R]
    c = cos.to(compute)[:, None, :]  # [N, 1, R/2]
    s = sin.to(compute)[:, None, :]
    if style == "neox":
        x1, x2 = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2 :]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    o1 = x1 * c - x2 * s  # [N, h, R/2]
    o2 = x2 * c + x1 * s
    out = torch.cat((o1, o2), -1) if style == "neox" else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((out.to(x.dtype), x[..., rotary_dim:]), -1)


def _on_the_fly(x, positions, theta, rotary_dim, style, compute: torch.dtype) -> torch.Tensor:
    ang = angles(positions, theta, rotary_dim, compute)  # [N, R/2]
    return rotate(x, ang.cos(), ang.sin(), rotary_dim, style, compute)


@register("rope", "reference")
def reference(
    x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int, style: str = "neox"
) -> torch.Tensor:
    """Angles, cos/sin and rotation in fp32 (float64 for float64 ``x``), one final rounding.

    Who: the yardstick; on float64 inputs it is the ground truth (angles exact to 1e-16, which
    fp32 engines cannot match at long positions).
    """
    check(x, positions, theta, rotary_dim, style)
    return _on_the_fly(x, positions, theta, rotary_dim, style, _checks.compute_dtype(x.dtype))


@register("rope", "fp32_compute")
def fp32_compute(
    x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int, style: str = "neox"
) -> torch.Tensor:
    """cos/sin computed on the fly in fp32, rotation in fp32 registers, one rounding.

    Who: TransformerEngine's fused RoPE (Megatron training), FlashInfer's
    ``apply_rope_pos_ids`` (SGLang). Pinned to fp32 even for float64
    inputs, so on float64 it shows the pure fp32-angle error against ``reference``.
    """
    check(x, positions, theta, rotary_dim, style)
    return _on_the_fly(x, positions, theta, rotary_dim, style, torch.float32)


@register("rope", "hf")
def hf(
    x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int, style: str = "neox"
) -> torch.Tensor:
    """transformers: ``LlamaRotaryEmbedding`` cos/sin in fp32, cast to ``x.dtype``, then
    ``apply_rotary_pos_emb`` arithmetic in ``x.dtype`` (bit-exact, see tests).

    Who: the HF training engine; Megatron's unfused ``apply_rotary_pos_emb`` does the same
    casts. Why it differs: cos/sin are rounded to bf16 and each product and sum is rounded to
    bf16 — four roundings per output instead of one. For ``style="gptj"`` the same recipe
    with interleaved pairs, bit-exact vs transformers' GPT-J (fp32 table cast to ``x.dtype``).
    """
    check(x, positions, theta, rotary_dim, style)
    ang = angles(positions, theta, rotary_dim, torch.float32)  # [N, R/2]
    return rotate(x, ang.cos().to(x.dtype), ang.sin().to(x.dtype), rotary_dim, style, x.dtype)


_TABLES: dict[tuple[float, int, torch.dtype, torch.device], torch.Tensor] = {}


def cos_sin_table(
    theta: float, rotary_dim: int, dtype: torch.dtype, device: torch.device, min_positions: int
) -> torch.Tensor:
    """vLLM's ``cos_sin_cache``: ``[L, R]`` = ``cat(cos, sin)`` of ``arange(L) * inv_freq``
    computed in fp32, then stored in ``dtype``. Cached per (theta, rotary_dim, dtype, device);
    grows (to a power of two) when a position beyond the table is requested. Rows are pure
    functions of the position, so growing never changes existing rows."""
    key = (float(theta), rotary_dim, dtype, torch.device(device))
    table = _TABLES.get(key)
    if table is None or table.shape[0] < min_positions:
        length = max(4096, 1 << (min_positions - 1).bit_length())
        t = torch.arange(length, dtype=torch.float32, device=device)  # [L]
        freqs = torch.einsum("i,j->ij", t, inv_freq(theta, rotary_dim, torch.float32, device))  # [L, R/2]
        table = torch.cat((freqs.cos(), freqs.sin()), -1).to(dtype)  # [L, R]
        _TABLES[key] = table
    return table


@register("rope", "cached_table")
def cached_table(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    theta: float,
    rotary_dim: int,
    style: str = "neox",
    cache_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """cos/sin read from a precomputed table stored in ``cache_dtype`` (default ``x.dtype``);
    the rotation runs in ``promote(x.dtype, cache_dtype)``.

    Who: vLLM ``RotaryEmbedding`` (table built in fp32 at init and cast to the model dtype;
    the CUDA kernel multiplies in ``scalar_t``) — the default. ``cache_dtype=torch.float32``
    with bf16 ``x`` is SGLang/FlashInfer's ``apply_rope_with_cos_sin_cache``: fp32 table, fp32
    math. Why it differs: a bf16 table rounds cos/sin once more than on-the-fly fp32; with the
    vLLM default the numbers coincide with ``hf`` for neox (same fp32 angles, same casts), which
    is itself a useful fact: the table is not the culprit, the dtype it is stored in is.
    """
    check(x, positions, theta, rotary_dim, style)
    cache_dtype = x.dtype if cache_dtype is None else cache_dtype
    if not cache_dtype.is_floating_point:
        raise TypeError(f"cache_dtype must be a floating dtype, got {cache_dtype}")
    if positions.numel() == 0:
        return x.clone()
    if not _checks.skipped() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0 to index the cos/sin table, got min {int(positions.min())}")
    table = cos_sin_table(theta, rotary_dim, cache_dtype, x.device, int(positions.max()) + 1)
    rows = table.index_select(0, positions)  # [N, R]
    cos, sin = rows.chunk(2, dim=-1)
    return rotate(x, cos, sin, rotary_dim, style, torch.promote_types(x.dtype, cache_dtype))


def _triton_impl(numerics: str) -> Callable[..., torch.Tensor]:
    """The Triton implementation of torch variant ``numerics`` (one kernel, numerics a constexpr)."""

    def run(
        x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int, style: str = "neox"
    ) -> torch.Tensor:
        check(x, positions, theta, rotary_dim, style)
        mod = _triton.load("triton_rope", x)
        return mod.rope(x, positions, theta=theta, rotary_dim=rotary_dim, style=style, numerics=numerics)

    run.__doc__ = (f"Triton kernel computing ``{numerics}`` (the same fp32 angles; sin/cos within an fp32 "
                   "ulp or two). Who: FlashInfer/SGLang-style on-the-fly RoPE kernels: all heads of a token "
                   "in one program, cos/sin computed once per (token, frequency).")
    return run


for _name in ("fp32_compute", "hf"):
    register("rope", _name, impl="triton")(_triton_impl(_name))
