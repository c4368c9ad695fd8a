"""What the gates take in: a checkpoint directory, token ids, and engine specs - checked before
anything heavy runs, so every bad input is a ``UsageError`` (CLI exit 2) naming the problem.

The built-in text (``corpus_text``) ships inside the package (``aligntools/data``), so it is found
in an installed copy as well as in a checkout.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minirl import EngineSpec


class UsageError(ValueError):
    """Bad input (a path, engine spec, knob, token ids, checkpoint, tolerance file), found before
    anything heavy runs: ``mlab`` exits 2 with the message as its one line. One class for the
    gate's API and every CLI command, so a caller catches one type whichever refused the input."""


GateUsageError = UsageError
"""The gate's public name for ``UsageError`` (``aligntools.gates.GateUsageError``)."""


def corpus_text() -> str:
    """The built-in English text (``aligntools/data/tiny_corpus.txt``) the gates tokenize."""
    return resources.files("aligntools").joinpath("data", "tiny_corpus.txt").read_text()


def validate_checkpoint(path: str | os.PathLike) -> Path:
    """An HF checkpoint directory whose config.json and safetensors headers read, else a
    ``UsageError`` that says what is wrong (no model is loaded here)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"model path {p} does not exist")
    cfg = p / "config.json"
    if not p.is_dir() or not cfg.is_file():
        raise UsageError(f"{p} is not an HF checkpoint directory (no config.json)")
    try:
        config = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"unreadable checkpoint {p}: config.json: {e}") from e
    if not isinstance(config, dict):
        raise UsageError(f"unreadable checkpoint {p}: config.json holds a {type(config).__name__}, not an object")
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise UsageError(f"unreadable checkpoint {p}: no *.safetensors weights")
    from safetensors import safe_open

    names: list[str] = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                names += list(st.keys())
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise UsageError(f"unreadable checkpoint {p}: {f.name}: {e}") from e
    _check_layer_count(p, config, names)
    return p


def _check_layer_count(path: Path, config: dict, names: list[str]) -> None:
    """transformers fills layers missing from the weights with random values and only warns;
    a gate that then compares random layers would be meaningless, so it stops here."""
    declared = config.get("num_hidden_layers")
    found = {int(n.split(".")[2]) for n in names if n.startswith("model.layers.") and n.split(".")[2].isdigit()}
    if isinstance(declared, int) and found and len(found) != declared:
        raise UsageError(f"checkpoint {path}: config.json says num_hidden_layers={declared} but the weights "
                         f"hold {len(found)} layers (indices {min(found)}..{max(found)}); the missing layers "
                         f"would be random. Fix config.json or the weights")


def prepare_tokens(path: Path, tokens: int | torch.Tensor, n_seqs: int = 4) -> torch.Tensor:
    """Token ids [B, S]: given ids pass through; a count takes that many tokens of the built-in
    corpus (repeated if short), tokenized with the checkpoint's tokenizer, as ``n_seqs``
    equal-length sequences (no padding, so both engines see exactly the same rows)."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise UsageError(f"token ids must be [batch, seq >= 2]; got {tuple(tokens.shape)}")
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise UsageError(f"tokens: token ids must be an integer tensor; got {tokens.dtype} (a cast would "
                             f"truncate 5.7 to 5 and gate other tokens than given). Give integer ids, e.g. "
                             f"torch.tensor(ids, dtype=torch.long)")
        return tokens.long()
    if isinstance(tokens, bool) or not hasattr(type(tokens), "__index__"):  # int, numpy ints; not 2.5
        raise UsageError(f"tokens must be a count of built-in text tokens (an int such as 256) or token ids "
                         f"[batch, seq] (an integer torch.Tensor); got {type(tokens).__name__} {tokens!r:.40}")
    if int(tokens) < 2 * n_seqs:
        raise UsageError(f"--tokens must be at least {2 * n_seqs}; got {tokens}")
    _check_positions(path, int(tokens) // n_seqs, n_seqs)
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad tokenizer
        raise UsageError(f"unreadable checkpoint {path}: cannot load its tokenizer: {e}") from e
    ids = tok(corpus_text())["input_ids"]
    ids = (ids * (1 + int(tokens) // max(len(ids), 1)))[: int(tokens)]
    seq = int(tokens) // n_seqs
    return torch.tensor(ids[: seq * n_seqs]).view(n_seqs, seq)


def parse_train(spec: str) -> EngineSpec:
    """The training engine, transformers: ``hf`` -> float32, ``hf:bfloat16,attn=eager`` -> bfloat16
    with eager attention (``options``: ``attn``, ``experts``; absent = transformers' own defaults,
    what a stock trainer runs). The dtype comes back resolved."""
    parsed = _parse(spec)
    if parsed.kind != "hf":
        raise UsageError(f"--train must be hf[:DTYPE][,attn=...][,experts=...] (the transformers training "
                         f"engine); got {spec!r}")
    return parsed.replace(dtype=parsed.engine_dtype())


def _check_positions(path: Path, seq: int, n_seqs: int) -> None:
    """Sequences longer than the model's positions would be garbage (and, at 10^8 tokens, a
    50 GB allocation attempt): refuse them with the limit, before any tokenizer or model loads."""
    try:
        max_pos = json.loads((Path(path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return  # validate_checkpoint reports an unreadable config
    if isinstance(max_pos, int) and not isinstance(max_pos, bool) and seq > max_pos:
        raise UsageError(f"--tokens {seq * n_seqs} makes {n_seqs} sequences of {seq} tokens, over the model's "
                         f"max_position_embeddings {max_pos}; use --tokens {n_seqs * max_pos} or fewer")


@dataclass(frozen=True)
class InferSpec:
    """The inference side: its ``EngineSpec`` as given, with the dtype (and minirl's preset)
    resolved, and the trainer's attention backend the aligned presets follow (``following``)."""

    spec: EngineSpec
    attention: str | None = None

    @property
    def built(self) -> EngineSpec:
        """The spec the engine is built from: the given one plus the followed attention."""
        return self.spec.replace(options={**self.spec.options, "attention": self.attention}) if self.attention \
            else self.spec

    @property
    def label(self) -> str:
        """``minirl:typical,rmsnorm=hf:bfloat16`` / ``vllm,max_model_len=512:bfloat16``: every option shows."""
        return f"{self.spec.replace(dtype=None)}:{self.spec.dtype}"

    def following(self, train_attention: str | None) -> "InferSpec":
        """The aligned presets (``aligned``, ``hf_exact``) mean the trainer's own attention kernel
        (``hf_exact`` is bit-exact only then): without an explicit ``attention=`` override they
        take the one the training model runs. vLLM (no presets) runs its own kernels: unchanged."""
        if self.spec.preset in (None, "typical") or "attention" in self.spec.options:
            return self
        return dataclasses.replace(self, attention=follow_attention(train_attention).get("attention"))


def follow_attention(train_attention: str | None) -> dict[str, str]:
    """Knob change that gives the engine the trainer's attention backend ({} if it has no twin)."""
    return {"attention": train_attention} if train_attention in ("eager", "sdpa") else {}


def parse_infer(spec: str, dtype: str | None) -> InferSpec:
    """An engine that generates rollouts (``minirl[:PRESET|DTYPE][,knob=value...]``,
    ``vllm[:DTYPE][,option=value...]``, ``sglang[:DTYPE][,max_total_tokens=N]``) and can run here; the
    dtype is the spec's, else ``dtype``, else the kind's default (``minirl.engines.KINDS``)."""
    from minirl import engine_kind

    parsed = _parse(spec)
    row = engine_kind(parsed.kind)
    if row.rollouts is None:
        raise UsageError(f"--infer must be minirl[:PRESET][,knob=value...], vllm[:DTYPE][,option=value...] or "
                         f"sglang[:DTYPE][,max_total_tokens=N]; got {spec!r} ({parsed.kind} does not roll out)")
    reason = row.unavailable()
    if reason:
        raise UsageError(f"--infer {spec}: {reason}")
    try:
        return InferSpec(parsed.replace(dtype=parsed.engine_dtype(dtype), preset=parsed.preset or row.default_preset))
    except ValueError as e:
        raise UsageError(str(e)) from e


def _parse(spec: str) -> EngineSpec:
    """The one engine-spec grammar (``minirl.EngineSpec``); its errors are usage errors."""
    from minirl import EngineSpec

    try:
        return EngineSpec.parse(spec)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from e


def load_hf(path: Path, dtype: str, **options: str):
    """The training engine (``build_engine`` of an ``hf`` spec); an unreadable checkpoint is a
    usage error."""
    from minirl import EngineSpec, build_engine

    spec = EngineSpec("hf", dtype, None, options)
    try:
        return build_engine(spec, path)
    except Exception as e:  # noqa: BLE001 - a bad checkpoint surfaces as many error types
        raise UsageError(f"unreadable checkpoint {path}: {type(e).__name__}: {e}") from e
