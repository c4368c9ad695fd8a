"""Read an HF checkpoint directory: ``config.json`` + safetensors (never pickle).

Why not ``transformers.from_pretrained``: the inference side must load the *same files* the
training side loads, but through its own code path, the way vLLM/SGLang do; and safetensors
cannot execute code, unlike ``torch.load`` on a ``.bin``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open


def read_config(path: str | os.PathLike) -> dict:
    """The checkpoint's ``config.json`` as parsed (``archs.model_spec`` refuses one that is no object).
    A FIFO or device there is refused without opening it: an open would wait for a writer forever."""
    f = Path(path) / "config.json"
    if not f.exists():
        raise FileNotFoundError(f"{f} not found: expected an HF checkpoint directory "
                                f"(config.json + model.safetensors)")
    if not f.is_file():
        raise ValueError(f"{f} is not a regular file ({_kind(f)}); an HF checkpoint's config.json is a JSON file: "
                         f"re-save the checkpoint")
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f} is not valid JSON ({e}); re-save the checkpoint's config") from e


def _kind(path: Path) -> str:
    """What a path that is not a regular file is, in words."""
    mode = path.stat().st_mode
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


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
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    out[name] = _float_weight(f, name, st.get_tensor(name))
        except SafetensorError as e:
            raise ValueError(f"{f} is not a readable safetensors file ({e}); re-save the checkpoint") from None
    return out


def _float_weight(file: Path, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, unless it is an integer or bool weight: a quantized or corrupted export, whose
    integers the engine would cast to float as if they were weights (an int8 embedding read as
    its raw codes). minirl quantizes float weights itself (``weights=int4``)."""
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return tensor
    raise ValueError(f"{file}: tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')}, an integer weight in "
                     f"a float checkpoint (a quantized export?); minirl reads float checkpoints and quantizes "
                     f"them itself (engine option weights=...): re-save the checkpoint in float32 or bfloat16")
