"""Checkpoints as safetensors + JSON (no pickle: a checkpoint can be loaded without trusting it).

Layout of ``<dir>``: ``model.safetensors`` (trainer weights, HF names), ``optimizer.safetensors``
(per-parameter state tensors) + ``optimizer.json`` (param groups), ``rng.safetensors`` (torch
CPU/CUDA generator states) and ``state.json`` (step, data position, Python RNG, counters, the
metric rows). Written to a temporary sibling and renamed in, so a crash mid-save keeps the
previous checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, tmp / "model.safetensors")
        opt = optimizer.state_dict()
        tensors = {f"{idx}.{name}": (v if isinstance(v, torch.Tensor) else torch.tensor(v)).contiguous().cpu()
                   for idx, s in opt["state"].items() for name, v in s.items()}
        save_file(tensors, tmp / "optimizer.safetensors")
        (tmp / "optimizer.json").write_text(json.dumps(opt["param_groups"]))
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        save_file(rng, tmp / "rng.safetensors")
        py_state = random.getstate()
        full = {**state, "python_random": [py_state[0], list(py_state[1]), py_state[2]]}
        (tmp / "state.json").write_text(json.dumps(full))
        old = path.with_name(f".{path.name}.old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def load(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model, optimizer and RNG states in place; return ``state`` as saved."""
    path = Path(path)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (state.json missing); start without resume")
    model.load_state_dict(load_file(path / "model.safetensors"))
    flat = load_file(path / "optimizer.safetensors")
    per_param: dict[int, dict] = {}
    for key, value in flat.items():
        idx, name = key.split(".", 1)
        per_param.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": per_param, "param_groups": json.loads((path / "optimizer.json").read_text())})
    rng = load_file(path / "rng.safetensors")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    state = json.loads((path / "state.json").read_text())
    version, internal, gauss = state.pop("python_random")
    random.setstate((version, tuple(internal), gauss))
    return state
