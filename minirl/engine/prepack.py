"""The engine's linear layer on CPU bf16 weights: oneDNN's kernel on a weight packed once where this
CPU runs bf16 natively, the same product as an fp32 GEMM where it does not.

Packed (AVX-512-BF16 / AMX, ``available()``): ``F.linear`` hands oneDNN a plain ``[O, K]`` bf16
matrix, and oneDNN reorders it into its blocked layout on *every* call. At decode shapes, a few
dozen rows, that reorder is a third to a half of the GEMM: smollm2-135m's ``[32, 576] @ [576, 3072]``
takes 313 us through ``F.linear`` and 209 us on a weight packed once; its ``[49152, 576]`` lm_head
7.9 ms vs 3.9 ms (one thread, docs/measurements/2026-12-03-prepack.md). vLLM's CPU backend packs its
weights the same way (``onednn_mm``). The product is bitwise ``F.linear``'s: the same oneDNN kernel
reads the same numbers, only the reorder moves; tests/minirl/engine/test_prepack.py pins that over
odd and real shapes and row counts, so no knob changes meaning.

Emulated (every other CPU, e.g. AVX2 only): torch's bf16 GEMM there runs at a sixth of the fp32
rate (docs/measurements/2026-12-06-bf16-emulation.md). A bf16 GEMM is bf16 operands, fp32
accumulation, one rounding of the output to bf16; bf16 values are exact in fp32, so an fp32 GEMM on
the operands (the weight's fp32 copy kept), bias added in fp32, rounded once, is that product up to
summation order, at the fp32 rate. ``emulates()`` picks the path; ``MINIRL_BF16_GEMM`` forces it.

A kept copy (packed or fp32) follows its weight: it is rebuilt when the weight's version counter
moves (an in-place write such as the engine's weight sync, or a notebook's ``w.mul_(1.01)``), and
``clear`` drops every copy (``Transformer.load`` / ``to`` call it, which also covers weights made
under ``torch.inference_mode``, where tensors keep no version counter). Anything else (fp32, CUDA,
autograd) is plain ``F.linear``.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

log = logging.getLogger(__name__)

PACK_ROWS = 32
"""The row-count hint oneDNN picks its packed format for. Fixed, not the first call's rows:
the format decides the kernel, and a format chosen for 1 row gave other bits than ``F.linear``
at 300 rows; 16-128 matched it everywhere tested (decode runs 1-64 rows, prefill thousands)."""

ENV = "MINIRL_BF16_GEMM"
"""Environment variable forcing the CPU bf16 GEMM path: ``native`` (torch's bf16 kernel, packed
where ``available()``), ``emulated`` (fp32 GEMMs on the bf16 operands), ``auto`` (the default:
native where ``available()``, emulated elsewhere). Tests and benchmarks run both paths on any box."""
CHOICES = ("auto", "native", "emulated")


@functools.cache
def available() -> bool:
    """Whether this CPU's torch runs bf16 ``F.linear`` through oneDNN (AVX-512-BF16 or AMX):
    only then is a prepacked product the same kernel, hence the same bits."""
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and bool(mkldnn._is_mkldnn_bf16_supported()))


def emulates() -> bool:
    """Whether CPU bf16 GEMMs run emulated (``ENV``). Read per call, so a test or a benchmark
    switches paths in one process; announced once per path and process, since a bf16 run's speed
    and its last bits depend on it."""
    choice = os.environ.get(ENV, "auto")
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    emulated = not available() if choice == "auto" else choice == "emulated"
    _announce(emulated, available())
    return emulated


@functools.cache
def _announce(emulated: bool, native: bool) -> None:
    how = ("emulated as fp32 GEMMs on bf16 operands" if emulated
           else "oneDNN's native kernel, weights prepacked" if native else "torch's bf16 kernel")
    has = "native" if native else "no native"
    log.warning("bf16 GEMMs: %s (this CPU has %s bf16: %s; %s=native|emulated forces a path)",
                how, has, torch.backends.cpu.get_cpu_capability(), ENV)


def emulated_linear(x: torch.Tensor, w32: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A bf16 GEMM's product as an fp32 GEMM: x [..., K] bf16, w32 [O, K] fp32 (a bf16 weight's
    exact copy), bias [O] or None -> [..., O] in x's dtype, rounded once after the fp32 bias add."""
    return F.linear(x.float(), w32, None if bias is None else bias.float()).to(x.dtype)


class Fp32Copies:
    """fp32 copies of bf16 weights, refreshed in place when a weight's version counter moves."""

    def __init__(self) -> None:
        self._copies = WeakIdKeyDictionary()  # weight -> [its version or None, fp32 copy]

    def get(self, w: torch.Tensor) -> torch.Tensor:
        """w [O, K] bf16 -> its fp32 copy [O, K], kept while w lives (no autograd history)."""
        version = None if w.is_inference() else w._version
        entry = self._copies.get(w)
        if entry is None:
            with torch.inference_mode(False):  # a normal tensor, refreshable in or out of inference mode
                entry = self._copies[w] = [version, w.detach().float()]
        elif entry[0] != version:
            entry[1].copy_(w.detach())
            entry[0] = version
        return entry[1]

    def clear(self) -> None:
        self._copies.clear()

    def __len__(self) -> int:
        return len(self._copies)


class PrepackedLinear:
    """``linear(x, w, bias)``: ``F.linear``'s bf16 product, at the best rate this CPU has for it
    (packed: its bits; emulated: up to summation order); anything else is ``F.linear``."""

    def __init__(self, exact: bool = False) -> None:
        self.exact = exact
        """Keep torch's own bf16 kernel (never emulated): an engine whose knobs reproduce transformers'
        math bit for bit (``aligned``, ``hf_exact``) must run the GEMM a stock bf16 trainer runs."""
        self._packed = WeakIdKeyDictionary()  # weight -> (its version or None, packed weight)
        self._fp32 = Fp32Copies()

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K], w [O, K], bias [O] or None -> [..., O]."""
        if not _cpu_bf16_inference(x, w, bias):
            return F.linear(x, w, bias)
        if not self.exact and emulates():
            # a tensor-parallel slice is a fresh view each call: nothing to keep
            return emulated_linear(x, self._fp32.get(w) if w.is_contiguous() else w.float(), bias)
        if not (w.is_contiguous() and available()):
            return F.linear(x, w, bias)
        version = None if w.is_inference() else w._version
        entry = self._packed.get(w)
        if entry is None or entry[0] != version:
            entry = (version, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS))
            self._packed[w] = entry
        return torch.ops.mkldnn._linear_pointwise(x, entry[1], bias, "none", [], "")

    def clear(self) -> None:
        """Drop every kept copy (after the weights were written or moved)."""
        self._packed.clear()
        self._fp32.clear()


def _cpu_bf16_inference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """A CPU bf16 GEMM without autograd: the calls this module speeds up."""
    return (w.device.type == "cpu" and w.dtype == torch.bfloat16 and x.dtype == w.dtype and w.dim() == 2
            and (bias is None or bias.dtype == w.dtype)
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)))
