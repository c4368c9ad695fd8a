"""Checkpoints as safetensors + JSON (no pickle: a checkpoint can be loaded without trusting it).

Layout of ``<dir>``: ``model.safetensors`` (trainer weights, HF names; tied weights such as
``lm_head.weight`` = ``embed_tokens.weight`` stored once and named in the file's ``tied``
metadata, since safetensors refuses tensors that share memory), ``optimizer.safetensors``
(per-parameter state tensors) + ``optimizer.json`` (param groups), ``rng.safetensors`` (torch
CPU/CUDA generator states) and ``state.json`` (step, Python RNG, counters, the metric rows).

What can go wrong, and what happens:

* a crash mid-save: the new checkpoint is written to a temporary sibling and swapped in; the
  previous one is moved to ``.<name>.old`` for the swap. A crash between the two renames leaves
  only ``.<name>.old``: ``load`` moves it back (``recover``); nothing ever deletes it but the save
  that moved it there, after its replacement is in place.
* non-finite weights or optimizer state: ``save`` refuses (naming the tensor), so a checkpoint
  is always one a run can continue from; ``load`` refuses a file that has one anyway.
* a damaged file: ``load`` raises ``CheckpointError`` naming the file and what is wrong.
* a full disk: ``save`` raises ``CheckpointError`` naming the checkpoint and that it needs room
  for a second copy; the partial copy is removed, the previous checkpoint stays.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or trusted; the message names the file or tensor."""


def save(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> Path:
    """Write a checkpoint of ``model``, ``optimizer``, the RNGs and the JSON-able ``state``."""
    path = Path(path)
    weights, tied = _untie(model.state_dict())
    opt = optimizer.state_dict()
    opt_tensors = {f"{idx}.{name}": (v if isinstance(v, torch.Tensor) else torch.tensor(v)).detach().contiguous().cpu()
                   for idx, s in opt["state"].items() for name, v in s.items()}
    _refuse_nonfinite(weights, f"refusing to write {path}: weight")
    _refuse_nonfinite(opt_tensors, f"refusing to write {path}: optimizer state")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        try:
            _write(tmp, weights, tied, opt_tensors, opt["param_groups"], state)
        except (OSError, SafetensorError) as e:
            if not _disk_full(e):
                raise
            nbytes = sum(t.nbytes for t in (*weights.values(), *opt_tensors.values()))
            raise CheckpointError(_no_room(path, tmp, nbytes)) from None
        old = _old(path)
        moved = path.exists()
        if moved:  # the previous checkpoint steps aside; an older .old is superseded by it
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
        if moved:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _write(tmp: Path, weights: dict, tied: dict, opt_tensors: dict, param_groups: list, state: dict) -> None:
    """A checkpoint's files into the fresh directory ``tmp`` (``save`` swaps it in)."""
    save_file(weights, tmp / "model.safetensors", metadata={"tied": json.dumps(tied)})
    save_file(opt_tensors, tmp / "optimizer.safetensors")
    (tmp / "optimizer.json").write_text(json.dumps(param_groups))
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_file(rng, tmp / "rng.safetensors")
    py_state = random.getstate()
    (tmp / "state.json").write_text(json.dumps({**state, "python_random": [py_state[0], list(py_state[1]),
                                                                           py_state[2]]}))


def _disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk is full: ``OSError`` ENOSPC, or safetensors' own error quoting it
    ("... No space left on device (os error 28)": it is no OSError)."""
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or f"(os error {errno.ENOSPC})" in str(e)


def _no_room(path: Path, tmp: Path, nbytes: int) -> str:
    """A full disk at a save: what was being written and why it needs room (the previous copy stays)."""
    then = ("the previous checkpoint and the log up to it are intact: free space there, then continue with --resume"
            if exists(path) else "no checkpoint was written yet: free space there (or set another out_dir) and start "
            "again with --overwrite")
    return (f"no space left on the device of {path.parent} while writing the checkpoint {path} (into {tmp.name} "
            f"beside it): a checkpoint is written in full beside the previous one before it replaces it, so the "
            f"disk needs room for a second copy (~{nbytes / 1e6:.1f} MB); {then}")


def exists(path: str | os.PathLike) -> bool:
    """A checkpoint (or the ``.old`` copy a crash mid-save left) is at ``path``."""
    path = Path(path)
    return (path / "state.json").exists() or (not path.exists() and (_old(path) / "state.json").exists())


def recover(path: str | os.PathLike) -> Path:
    """Move ``.<name>.old`` back to ``path`` when a crash between a save's two renames left only
    it; refuse (naming both) when ``path`` exists but is not a complete checkpoint."""
    path, old = Path(path), _old(Path(path))
    if not path.exists() and (old / "state.json").exists():
        old.rename(path)
    elif path.exists() and not (path / "state.json").exists():
        raise CheckpointError(f"{path} has no state.json: it is not a complete checkpoint"
                              f"{f' (the previous one is at {old})' if old.exists() else ''}; move it aside and "
                              f"resume from a complete copy, or start again with --overwrite")
    return path


def read_state(path: str | os.PathLike) -> dict:
    """The checkpoint's ``state.json`` (step, metric rows, the config it was trained with), read
    from ``path`` or the ``.old`` copy a crash mid-save left, with nothing loaded or moved: what a
    resume is refused on before any model loads or worker starts."""
    path = Path(path)
    if not exists(path):
        raise FileNotFoundError(f"no checkpoint at {path} (state.json missing); start without resume")
    f = (path if path.exists() else _old(path)) / "state.json"
    state = _read(f, lambda f: json.loads(f.read_text()))
    if not isinstance(state, dict) or not isinstance(state.get("python_random"), list):
        raise CheckpointError(f"{f}: not a checkpoint state (a JSON object with python_random)")
    return state


def load(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model, optimizer and RNG states in place; return ``state`` as saved. Every file is
    checked before anything is changed where that is cheap (state.json, tensors' finiteness)."""
    state = read_state(path)
    path = recover(Path(path))
    weights, meta = _read(path / "model.safetensors", _tensors)
    tied = _read(path / "model.safetensors", lambda f: json.loads(meta.get("tied", "{}")))
    flat, _ = _read(path / "optimizer.safetensors", _tensors)
    _refuse_nonfinite(weights, f"{path / 'model.safetensors'} cannot be resumed: tensor")
    _refuse_nonfinite(flat, f"{path / 'optimizer.safetensors'} cannot be resumed: tensor")
    weights.update({alias: weights[name] for alias, name in tied.items() if name in weights})
    _read(path / "model.safetensors", lambda f: model.load_state_dict(weights))
    groups = _read(path / "optimizer.json", lambda f: _param_groups(f, optimizer))

    def load_optimizer(f: Path) -> None:
        per_param: dict[int, dict] = {}
        for key, value in flat.items():
            idx, name = key.split(".", 1)
            per_param.setdefault(int(idx), {})[name] = value
        optimizer.load_state_dict({"state": per_param, "param_groups": groups})

    _read(path / "optimizer.safetensors", load_optimizer)
    rng, _ = _read(path / "rng.safetensors", _tensors)

    def set_rng(f: Path) -> None:
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])

    _read(path / "rng.safetensors", set_rng)

    def set_python_random(f: Path) -> None:
        version, internal, gauss = state.pop("python_random")
        random.setstate((version, tuple(internal), gauss))

    _read(path / "state.json", set_python_random)
    return state


@functools.lru_cache(maxsize=8)
def _identity(directory: str, stamp: tuple) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stamp:
        with open(Path(directory) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def model_identity(directory: str | os.PathLike) -> str:
    """sha256 of a checkpoint directory's weight files (``*.safetensors``, ``*.bin``): what a
    resumed run checks it continues the same model, whatever the directory is called now."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    return _identity(str(directory), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))


def _old(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def _untie(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors to write (each shared storage once) and ``{alias: stored name}`` for the rest."""
    out: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in weights.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if key in seen:
            tied[name] = seen[key]
        else:
            seen[key] = name
            out[name] = t.detach().contiguous().cpu()
    return out, tied


def _refuse_nonfinite(tensors: dict[str, torch.Tensor], what: str) -> None:
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"{what} {name!r} has {bad} non-finite values (NaN/inf) of {t.numel()}; a "
                                  f"checkpoint with one cannot continue a run")


def _param_groups(f: Path, optimizer: torch.optim.Optimizer) -> list[dict]:
    """The saved param groups, refused here (naming optimizer.json) unless they are shaped as
    ``optimizer``'s: a mismatch would otherwise surface as a damaged optimizer.safetensors."""
    groups = json.loads(f.read_text())
    if not (isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                             for g in groups)):
        raise ValueError("expected a list of optimizer param groups, each with its 'params'")
    want = [len(g["params"]) for g in optimizer.param_groups]
    if [len(g["params"]) for g in groups] != want:
        raise ValueError(f"its param groups hold {[len(g['params']) for g in groups]} parameters, the "
                         f"optimizer's {want}")
    return groups


def _tensors(f: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(f, framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata() or {}


def _read(f: Path, use):  # noqa: ANN001, ANN202 - a small local combinator
    """``use(f)``; any failure becomes a CheckpointError naming ``f``."""
    try:
        return use(f)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a damaged file raises, the file is the answer
        raise CheckpointError(f"checkpoint file {f} is damaged or does not match this model "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:300]}); restore it from a copy, "
                              f"or start again with --overwrite") from None
