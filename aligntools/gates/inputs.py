"""What the gates take in: a checkpoint directory, token ids, and engine specs - checked before
anything heavy runs, so every bad input is a ``GateUsageError`` (CLI exit 2) naming the problem.

The built-in text (``corpus_text``) ships inside the package (``aligntools/data``), so it is found
in an installed copy as well as in a checkout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minirl import Knobs


class GateUsageError(ValueError):
    """Bad input to the gate (path, engine spec, knob, checkpoint, tolerance file): exit code 2."""


def corpus_text() -> str:
    """The built-in English text (``aligntools/data/tiny_corpus.txt``) the gates tokenize."""
    return resources.files("aligntools").joinpath("data", "tiny_corpus.txt").read_text()


def validate_checkpoint(path: str | os.PathLike) -> Path:
    """An HF checkpoint directory whose config.json and safetensors headers read, else a
    ``GateUsageError`` that says what is wrong (no model is loaded here)."""
    p = Path(path)
    if not p.exists():
        raise GateUsageError(f"model path {p} does not exist")
    cfg = p / "config.json"
    if not p.is_dir() or not cfg.is_file():
        raise GateUsageError(f"{p} is not an HF checkpoint directory (no config.json)")
    try:
        json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GateUsageError(f"unreadable checkpoint {p}: config.json: {e}") from e
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise GateUsageError(f"unreadable checkpoint {p}: no *.safetensors weights")
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                st.keys()
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise GateUsageError(f"unreadable checkpoint {p}: {f.name}: {e}") from e
    return p


def prepare_tokens(path: Path, tokens: int | torch.Tensor, n_seqs: int = 4) -> torch.Tensor:
    """Token ids [B, S]: given ids pass through; a count takes that many tokens of the built-in
    corpus (repeated if short), tokenized with the checkpoint's tokenizer, as ``n_seqs``
    equal-length sequences (no padding, so both engines see exactly the same rows)."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise GateUsageError(f"token ids must be [batch, seq >= 2]; got {tuple(tokens.shape)}")
        return tokens.long()
    if int(tokens) < 2 * n_seqs:
        raise GateUsageError(f"--tokens must be at least {2 * n_seqs}; got {tokens}")
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad tokenizer
        raise GateUsageError(f"unreadable checkpoint {path}: cannot load its tokenizer: {e}") from e
    ids = tok(corpus_text())["input_ids"]
    ids = (ids * (1 + int(tokens) // max(len(ids), 1)))[: int(tokens)]
    seq = int(tokens) // n_seqs
    return torch.tensor(ids[: seq * n_seqs]).view(n_seqs, seq)


def parse_train(spec: str) -> str:
    """``hf`` -> float32, ``hf:bfloat16`` -> bfloat16 (the training engine's dtype)."""
    name, dtype, _ = _parse(spec)
    if name != "hf":
        raise GateUsageError(f"--train must be hf[:DTYPE] (the transformers training engine); got {spec!r}")
    return dtype or "float32"


@dataclass(frozen=True)
class InferSpec:
    """The inference side: knobs (preset + overrides), the preset's name, dtype, overrides."""

    knobs: Knobs
    preset: str
    dtype: str
    overrides: dict

    @property
    def label(self) -> str:
        return f"minirl:{self.preset}:{self.dtype}"


def parse_infer(spec: str, dtype: str | None) -> InferSpec:
    """``minirl[:PRESET][,knob=value...]``. The preset sets the default dtype: bfloat16 for
    ``typical`` (what inference servers run), float32 for the aligned presets."""
    from aligntools.gates.engine_spec import minirl_default_dtype, minirl_knobs

    name, preset, overrides = _parse(spec)
    if name != "minirl":
        raise GateUsageError(f"--infer must be minirl[:PRESET][,knob=value...]; got {spec!r}")
    preset = preset or "typical"
    return InferSpec(minirl_knobs(preset, overrides), preset, dtype or minirl_default_dtype(preset), overrides)


def _parse(spec: str) -> tuple[str, str | None, dict]:
    """The shared engine-spec grammar (``aligntools.gates.engine_spec``); its errors are usage errors."""
    from aligntools.gates.engine_spec import parse_engine_spec

    try:
        return parse_engine_spec(spec)
    except ValueError as e:
        raise GateUsageError(str(e)) from e


def load_hf(path: Path, dtype: str):
    """The training engine (``engine_spec.load_hf``); an unreadable checkpoint is a usage error."""
    from aligntools.gates import engine_spec

    try:
        return engine_spec.load_hf(path, dtype)
    except Exception as e:  # noqa: BLE001 - a bad checkpoint surfaces as many error types
        raise GateUsageError(f"unreadable checkpoint {path}: {type(e).__name__}: {e}") from e
