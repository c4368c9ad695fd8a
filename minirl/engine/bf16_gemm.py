"""The trainer's bf16 GEMMs, forward and backward, as fp32 GEMMs on CPUs without native bf16.

Why: ``trainer_dtype: bfloat16`` computes in a bf16 copy of the model, and on an AVX2-only CPU
torch's bf16 GEMM runs at a sixth of the fp32 rate (docs/measurements/2026-12-06-bf16-emulation.md),
so the dtype meant to be fast was the slow one. A bf16 GEMM is bf16 operands, fp32 accumulation,
one rounding of the output to bf16 (after the bias add, for ``addmm``); bf16 values are exact in
fp32, so the same GEMM in fp32 on those operands, rounded once, is what a native bf16 kernel
computes up to summation order. ``minirl.engine.prepack`` does the same for the engine, and its
``emulates()`` picks the path for both.

``Bf16Gemms`` is a ``TorchDispatchMode``: it sees the ``mm`` / ``addmm`` / ``bmm`` kernels themselves,
below autograd, so one mode covers ``nn.Linear``'s forward and the GEMMs autograd's backward runs
for it, and the lm_head GEMMs of the fused log-prob kernel (``kernels/logprobs.py``), whose
hand-written backward calls ``mm`` directly. (A ``TorchFunctionMode`` would miss every backward GEMM:
autograd runs backward without Python function modes; dispatch modes it keeps.) Every other op
passes through unchanged. Parameters' fp32 copies, read through views such as ``W.T`` and
``W[rows]``, are kept (``prepack.Fp32Copies``) and refreshed when the parameter's version counter
moves, i.e. after each re-rounding of the compute copy from the fp32 master.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minirl.engine.prepack import Fp32Copies

aten = torch.ops.aten
GEMMS = {overload: op.default for op in (aten.mm, aten.addmm, aten.bmm) for overload in (op.default, op.out)}
"""Each bf16 GEMM kernel emulated -> the fp32 kernel that computes it (an ``out=`` form writes its
result into ``out`` afterwards)."""


class Bf16Gemms(TorchDispatchMode):
    """While active (``with mode:``), CPU bf16 GEMM kernels run as fp32 GEMMs on their bf16
    operands, each output rounded once to bf16 (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = Fp32Copies()

    def __torch_dispatch__(self, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        fp32_gemm = GEMMS.get(func)
        if fp32_gemm is None or not _cpu_bf16(args):
            return func(*args, **kwargs)
        kwargs = dict(kwargs)
        out = kwargs.pop("out", None)
        y = fp32_gemm(*(self.fp32(a) if isinstance(a, torch.Tensor) else a for a in args), **kwargs).bfloat16()
        return y if out is None else out.copy_(y)

    def fp32(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in fp32: a parameter, or a view of one, read from its kept copy; anything else
        (activations, gradients: new every call) converted here."""
        base = t if t._base is None else t._base
        if not (isinstance(base, torch.nn.Parameter) and base.is_contiguous()):
            return t.float()
        return self.copies.get(base).as_strided(t.shape, t.stride(), t.storage_offset() - base.storage_offset())


def _cpu_bf16(args: tuple) -> bool:
    """Whether every tensor operand is a CPU bf16 one (a GEMM in any other dtype passes through)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return all(t.device.type == "cpu" and t.dtype == torch.bfloat16 for t in tensors)
