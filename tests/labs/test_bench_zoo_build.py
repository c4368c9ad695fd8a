"""``make bench`` on a machine without ``.zoo``: bench_engine.py builds zoo models from inside
its ``inference_mode`` / ``no_grad`` timing functions, and a build trains (a backward pass).

Before: "element 0 of tensors does not require grad and does not have a grad_fn". The stand-in
build below does the same backward as a real one in milliseconds (a real build takes minutes
on a shared CPU box; ``MLAB_ZOO_DIR=$(mktemp -d)`` runs of both modes were checked by hand).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_engine.py"


@pytest.fixture
def bench_engine(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def train_like_a_build(name: str, out: Path) -> Path:
        weight = torch.ones(3, requires_grad=True)
        (weight * 2).sum().backward()
        assert weight.grad is not None
        return Path(out)

    monkeypatch.setattr(module.zoo, "build", train_like_a_build)
    monkeypatch.setenv("MLAB_ZOO_DIR", str(tmp_path))
    return module


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad])
def test_a_zoo_build_from_inside_a_timing_function_has_autograd(bench_engine, tmp_path, mode):
    with mode():
        assert bench_engine._zoo_path("tiny-llama") == tmp_path / "tiny-llama-seed0"
        assert not torch.is_grad_enabled()  # the caller's mode is back once the build returns
