"""Real SGLang (CPU torch, docs/sglang.md) in this process: each runner is created once per test
module and kept until its end, and its start-up time is recorded (``sglang_runner.started``).

The first runner of a process pays SGLang's import (~20 s of the ~25 s); later ones, in this
module or another module on the same worker, load only their model (~3-7 s).
"""

from __future__ import annotations

import pytest
import torch

from minirl.sglang.runner import unavailable_reason
from tests import engine_cache
from tests.engine_cache import module_engines

REASON = unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def sglang_runner(zoo):
    """``sglang_runner(zoo name or checkpoint path, dtype="float32", **options) -> SglangRunner``,
    created once per module; ``sglang_runner.started[(name, dtype)]`` is its start-up in seconds."""
    from minirl.sglang.runner import create_runner

    yield from module_engines(create_runner, zoo)


@pytest.fixture(scope="module")
def prompt_ids() -> torch.Tensor:
    return engine_cache.prompt_ids()
