"""``F.linear`` on CPU bf16 weights reordered once into oneDNN's blocked layout.

Why: on CPU, ``F.linear`` hands oneDNN a plain ``[O, K]`` bf16 matrix, and oneDNN reorders it
into its blocked (AMX / AVX-512-BF16) layout on *every* call. At decode shapes, a few dozen rows,
that reorder is a third to a half of the GEMM: smollm2-135m's ``[32, 576] @ [576, 3072]`` takes
313 us through ``F.linear`` and 209 us on a weight packed once; its ``[49152, 576]`` lm_head 7.9 ms
vs 3.9 ms (one thread, docs/measurements/2026-12-03-prepack.md). vLLM's CPU backend packs its
weights the same way (``onednn_mm``). The product is bitwise ``F.linear``'s: the same oneDNN
kernel reads the same numbers, only the reorder moves; tests/minirl/engine/test_prepack.py pins
that over odd and real shapes and row counts, so no knob changes meaning.

The packed copy follows its weight: it is rebuilt when the weight's version counter moves (an
in-place write such as the engine's weight sync, or a notebook's ``w.mul_(1.01)``), and
``clear`` drops every copy (``Transformer.load`` / ``to`` call it, which also covers weights
made under ``torch.inference_mode``, where tensors keep no version counter). Anything else
(fp32, CUDA, autograd, no bf16 oneDNN on this CPU) is plain ``F.linear``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

PACK_ROWS = 32
"""The row-count hint oneDNN picks its packed format for. Fixed, not the first call's rows:
the format decides the kernel, and a format chosen for 1 row gave other bits than ``F.linear``
at 300 rows; 16-128 matched it everywhere tested (decode runs 1-64 rows, prefill thousands)."""


@functools.cache
def available() -> bool:
    """Whether this CPU's torch runs bf16 ``F.linear`` through oneDNN (AVX-512-BF16 or AMX):
    only then is a prepacked product the same kernel, hence the same bits."""
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and bool(mkldnn._is_mkldnn_bf16_supported()))


class PrepackedLinear:
    """``linear(x, w, bias)`` == ``F.linear(x, w, bias)``, faster on CPU bf16 weights."""

    def __init__(self) -> None:
        self._packed = WeakIdKeyDictionary()  # weight -> (its version or None, packed weight)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K], w [O, K], bias [O] or None -> [..., O]."""
        if not self._packs(x, w, bias):
            return F.linear(x, w, bias)
        version = None if w.is_inference() else w._version
        entry = self._packed.get(w)
        if entry is None or entry[0] != version:
            entry = (version, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS))
            self._packed[w] = entry
        return torch.ops.mkldnn._linear_pointwise(x, entry[1], bias, "none", [], "")

    def clear(self) -> None:
        """Drop every packed copy (after the weights were written or moved)."""
        self._packed.clear()

    @staticmethod
    def _packs(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
        return (w.device.type == "cpu" and w.dtype == torch.bfloat16 and x.dtype == w.dtype and w.dim() == 2
                and w.is_contiguous()  # a tensor-parallel slice is a fresh view each call: nothing to keep
                and (bias is None or bias.dtype == w.dtype) and not (torch.is_grad_enabled() and
                                                                     (x.requires_grad or w.requires_grad))
                and available())
