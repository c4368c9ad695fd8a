"""Real in-process inference engines in tests (vLLM's and SGLang's CPU builds): each is created
once per test module and kept until its end, because deleting a vLLM ``LLM`` mid-module tears
down vLLM's process-wide groups and an SGLang runner costs ~25 s to start; and the token ids
that every engine test module prompts with."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Callable, Iterator

import torch


def module_engines(create: Callable[..., object], zoo: Callable[[str], Path]) -> Iterator[Callable[..., object]]:
    """For a module-scoped fixture: yields ``get(zoo name or checkpoint path, dtype="float32",
    **options)``, which creates an engine with ``create(path, dtype, **options)`` the first time
    and returns it after; ``get.started[(name, dtype)]`` is its start-up in seconds."""
    made: dict[tuple, object] = {}

    def get(name: str | Path, dtype: str = "float32", **options: object) -> object:
        key = (str(name), dtype, tuple(sorted(options.items())))
        if key not in made:
            t0 = time.perf_counter()
            made[key] = create(zoo(name) if isinstance(name, str) else name, dtype, **options)
            get.started[key[:2]] = time.perf_counter() - t0
        return made[key]

    get.started = {}
    yield get
    made.clear()
    gc.collect()


def prompt_ids() -> torch.Tensor:
    """[3, 24] token ids, the same for every engine of every test module."""
    return torch.randint(3, 500, (3, 24), generator=torch.Generator().manual_seed(0))
