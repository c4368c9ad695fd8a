"""Loading tensor dumps without running code from the file.

Why: a ``.pt`` or pickle is a program for the unpickler, and ``torch.load(weights_only=False)``
(what slime's own loader uses) runs whatever ``__reduce__`` the file names. Records come from other
people's runs, so every pickle is read by an allow-list: torch's ``weights_only`` unpickler for
torch files, ``RestrictedUnpickler`` for bare pickles, ``np.load(allow_pickle=False)`` and
safetensors for the rest. Anything outside the list is refused by its name before it is built.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

from aligntools.records.record import RecordError

NUMPY_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
}
"""What a numpy array inside a dump needs (slime keeps ``rollout_routed_experts`` as an ndarray):
array reconstruction and dtypes, none of which calls user code."""

BUILTIN_GLOBALS = {("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
                   ("collections", "OrderedDict"), ("_codecs", "encode")}
"""Plain containers (``_codecs.encode`` is how protocol-2 pickles store bytes)."""


class RestrictedUnpickler(pickle.Unpickler):
    """A pickle reader that builds containers, numbers, strings and numpy arrays only."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in BUILTIN_GLOBALS or (module, name) in NUMPY_GLOBALS or _is_numpy_dtype(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def load_pickle(path: Path) -> object:
    """A bare pickle read by ``RestrictedUnpickler``; a ``RecordError`` naming the refused global."""
    try:
        return RestrictedUnpickler(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as e:
        raise RecordError(_refusal(path, str(e))) from e
    except (EOFError, ValueError, TypeError) as e:
        raise RecordError(f"{path}: not a readable pickle ({e})") from e


def load_torch(path: Path) -> object:
    """A ``torch.save`` file read with ``weights_only=True`` plus the numpy allow-list; the globals
    it would need beyond that are named in the refusal, and nothing of the file is built first."""
    import torch

    allowed = _numpy_safe_globals()
    try:
        unsafe = [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
                  if tuple(g.rsplit(".", 1)) not in NUMPY_GLOBALS and not _is_numpy_dtype(*g.rsplit(".", 1))]
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/ValueError/zip errors for a broken file
        raise RecordError(f"{path}: not a readable torch.save file ({e})") from e
    if unsafe:
        raise RecordError(_refusal(path, ", ".join(unsafe)))
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise RecordError(_refusal(path, str(e).splitlines()[0])) from e
    except (RuntimeError, EOFError, ValueError) as e:
        raise RecordError(f"{path}: not a readable torch.save file ({e})") from e


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """An ``np.savez`` archive with object arrays refused (``allow_pickle=False``)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as e:
        raise RecordError(f"{path}: refusing an npz with object arrays (they are pickles: {e}); "
                          "save numeric arrays only") from e
    except OSError as e:
        raise RecordError(f"{path}: not a readable npz archive ({e})") from e


def load_safetensors(path: Path) -> dict:
    """A safetensors file as a dict of CPU tensors (the format holds no code)."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise RecordError(f"{path}: not a readable safetensors file ({e})") from e


def _refusal(path: Path, names: str) -> str:
    return (f"{path}: refusing to load it: it names {names}, which the record reader does not build "
            "(a pickle can run code from the file). Save plain dicts, lists, numbers and tensors "
            "(e.g. verl: batch.batch.to_dict() and torch.save that; slime: the samples as Sample.to_dict()), "
            "or write JSONL records (docs/audit.md)")


def _is_numpy_dtype(module: str, name: str) -> bool:
    return module == "numpy.dtypes" and name.endswith("DType")


def _numpy_safe_globals() -> list:
    import numpy.dtypes

    from numpy._core.multiarray import _reconstruct, scalar

    dtypes = [getattr(numpy.dtypes, n) for n in dir(numpy.dtypes) if n.endswith("DType")]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtypes]
