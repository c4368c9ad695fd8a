"""Real SGLang (CPU torch, docs/sglang.md) in this process: each runner is created once per test
module and kept until its end, and its start-up time is recorded (``sglang_runner.started``).

The first runner of a process pays SGLang's import (~20 s of the ~25 s); later ones, in this
module or another module on the same worker, load only their model (~3-7 s).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch

from minirl.sglang.runner import unavailable_reason

REASON = unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def sglang_runner(zoo):
    """``sglang_runner(zoo name or checkpoint path, dtype="float32", **options) -> SglangRunner``,
    created once per module; ``sglang_runner.started[(name, dtype)]`` is its start-up in seconds."""
    from minirl.sglang.runner import create_runner

    made: dict[tuple, object] = {}

    def get(name: str | Path, dtype: str = "float32", **options):
        key = (str(name), dtype, tuple(sorted(options.items())))
        if key not in made:
            t0 = time.perf_counter()
            made[key] = create_runner(zoo(name) if isinstance(name, str) else name, dtype, **options)
            get.started[key[:2]] = time.perf_counter() - t0
        return made[key]

    get.started = {}
    yield get
    made.clear()
    gc.collect()


@pytest.fixture(scope="module")
def prompt_ids() -> torch.Tensor:
    """[3, 24] token ids, the same as tests/vllm's."""
    return torch.randint(3, 500, (3, 24), generator=torch.Generator().manual_seed(0))
