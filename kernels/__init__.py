"""Mismatch Lab kernels: each numerically relevant op as the named variants real engines use,
switchable by name; a variant names numerics, the device picks torch or Triton.

    >>> import kernels
    >>> kernels.variants("rmsnorm")
    ['bf16_compute', 'fp32_residual', 'fused_add', 'hf', 'reference']
    >>> y = kernels.get("rmsnorm", "hf")(x, w, 1e-6)  # Triton on CUDA tensors, torch elsewhere
    >>> kernels.impls("rmsnorm", "hf")
    ['torch', 'triton']

Ops: ``rmsnorm``, ``rope``, ``router_topk``, ``logprobs`` (contracts in docs/architecture.md,
variants in docs/kernels.md), plus ``replay_gate`` for router replay and ``trusted()``, a
block that skips the argument checks for a caller that validated its inputs once.

Importing this package never imports triton (transformers imports it while probing for
Hugging Face's unrelated ``kernels`` hub package, so it must stay light). Deliberately no
``__version__``: transformers would read it as the hub package's version.
"""

from __future__ import annotations

from . import logprobs, rmsnorm, rope, router  # noqa: F401  (registration happens on import)
from ._checks import trusted
from .registry import get, impls, ops, register, variants
from .router import replay_gate

__all__ = ["get", "impls", "ops", "register", "replay_gate", "trusted", "variants"]
