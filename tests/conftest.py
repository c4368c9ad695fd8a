"""Shared test harness: markers, GPU auto-skip, zoo fixture, offline + interpreter env."""

from __future__ import annotations

import os
from pathlib import Path

# Set before anything imports transformers or triton.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton kernels run through the interpreter on CPU tensors (docs/machine.md).
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def zoo_root() -> Path:
    """Where zoo checkpoints live for the test session (reused across runs in the repo)."""
    root = Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))
    os.environ["MLAB_ZOO_DIR"] = str(root)
    return root


@pytest.fixture(scope="session")
def zoo(zoo_root: Path):
    """``zoo(name, seed=0) -> Path``: build (once, cached) and return a zoo checkpoint."""
    from labs import zoo as zoo_mod

    def get(name: str, seed: int = 0) -> Path:
        return zoo_mod.build(name, out=zoo_root / f"{name}-seed{seed}", seed=seed)

    return get
