"""Small numerics the engine owns (the rest comes from ``kernels``): dtype and device names,
the row-parallel GEMM with tensor-parallel emulation, and the MLP activations in their two flavours.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str | torch.dtype, act: torch.dtype | None = None) -> torch.dtype:
    """``"act"`` -> the activation dtype; a dtype name or torch.dtype -> itself."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"dtype {name} not supported; use one of {sorted(DTYPES)}")
        return name
    if name == "act" and act is not None:
        return act
    if name not in DTYPES:
        valid = sorted(DTYPES) + (["act"] if act is not None else [])
        raise ValueError(f"unknown dtype {name!r}; valid: {valid}")
    return DTYPES[name]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` -> the device the engine computes
    on (``"cuda"`` pinned to the current index, so two spellings of one GPU compare equal)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device such as 'cpu' or 'cuda'; got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device={device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "meta":
        raise ValueError("device='meta' holds no data and the engine computes with its weights; use 'cpu' or "
                         "'cuda' (the checkpoint is read either way)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: the minirl engine runs on 'cpu' or 'cuda'")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch.cuda.is_available() is False (no GPU, or a CPU build "
                         f"of torch); use device='cpu'")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def row_parallel_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, tp: int,
                        quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
                        linear: Callable[..., torch.Tensor] = F.linear) -> torch.Tensor:
    """``x @ w.T (+ bias)`` computed as ``tp`` ranks would: each rank multiplies its slice of
    the input features, and the partial sums are added in rank order in the activation
    dtype (an all-reduce of bf16 partials). Bias is added once, on rank 0, as vLLM's
    RowParallelLinear does. ``quant``: the input quantizer (``Knobs.activations``), applied to
    each rank's slice, since each rank quantizes the input it holds. ``linear``: the GEMM at tp 1
    (the engine's ``PrepackedLinear``, F.linear's bits). ``x``: [N, K], ``w``: [O, K] -> [N, O]."""
    if tp == 1:
        return linear(x if quant is None else quant(x), w, bias)
    xs, ws = x.chunk(tp, dim=-1), w.chunk(tp, dim=-1)
    if quant is not None:
        xs = tuple(quant(xr) for xr in xs)
    out = F.linear(xs[0], ws[0], bias)
    for xr, wr in zip(xs[1:], ws[1:]):
        out = out + F.linear(xr, wr)
    return out


ACT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
    "relu2": lambda x: torch.square(F.relu(x)),
}
"""transformers' ``ACT2FN`` entries by name, as its modules compute them (``relu2`` is
``ReLUSquaredActivation``: ``square(relu(x))``)."""


def act_mul(h: torch.Tensor, flavour: str, act: str = "silu", gated: bool = True) -> torch.Tensor:
    """The MLP's activation on a fused ``[..., 2I]`` gate_up output (``gated``) -> ``[..., I]``,
    or on a plain ``[..., I]`` up output (Arcee's ReLU², no gate).

    ``fused_silu_mul``: fp32 ``act(g) * u`` rounded once (vLLM ``silu_and_mul``,
    ``gelu_tanh_and_mul``; its ReLU² is fp32 and rounded once as well).
    ``hf``: ``act(g)`` rounded to the activation dtype, then ``* u`` (transformers).
    """
    fn = ACT_FNS[act]
    if not gated:
        return fn(h) if flavour == "hf" else fn(h.float()).to(h.dtype)
    g, u = h.chunk(2, dim=-1)
    if flavour == "hf":
        return fn(g) * u
    return (fn(g.float()) * u.float()).to(h.dtype)


ACTIVATIONS = ("fused_silu_mul", "hf")
