"""A tiny Llama with tied input/output embeddings (``tie_word_embeddings=True``), the layout of
smollm2-135m, built from the zoo's tiny-llama config and tokenizer: safetensors refuses tensors
that share memory, so a checkpoint of it must store the pair once and re-tie on load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch


def build_tied(zoo_llama: Path, out: Path, seed: int = 0) -> Path:
    """A seeded, untrained tied-embedding Llama (2 layers) at ``out`` with the zoo tokenizer."""
    import transformers

    if (out / "config.json").exists():
        return out
    config = json.loads((zoo_llama / "config.json").read_text())
    config.update(tie_word_embeddings=True, num_hidden_layers=2)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in config.items()
                                                                        if k not in ("architectures", "model_type")}))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    for f in zoo_llama.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out
