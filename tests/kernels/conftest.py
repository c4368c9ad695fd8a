"""Kernel tests: Triton kernels run through the interpreter on CPU (docs/machine.md).

``TRITON_INTERPRET`` must be in the environment before triton decorates a kernel; the kernel
modules are imported lazily, so setting it here (before any test runs) is enough even if the
top-level conftest did not. It is only set when there is no GPU, so a CUDA machine compiles.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

