"""Read an HF checkpoint directory: ``config.json`` + safetensors (never pickle).

Why not ``transformers.from_pretrained``: the inference side must load the *same files* the
training side loads, but through its own code path, the way vLLM/SGLang do; and safetensors
cannot execute code, unlike ``torch.load`` on a ``.bin``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open


def read_config(path: str | os.PathLike) -> dict:
    """The checkpoint's ``config.json`` as a dict."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: expected an HF checkpoint directory "
                                f"(config.json + model.safetensors)")
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f} is not valid JSON ({e}); re-save the checkpoint's config") from e


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards named by its index file."""
    root = Path(path)
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [root / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        found = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise FileNotFoundError(
            f"no model.safetensors (or model.safetensors.index.json) in {root}; found {found}. "
            f"Pickle checkpoints (.bin/.pt) are not loaded: re-save with safe_serialization=True.")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                out[name] = st.get_tensor(name)
    return out
