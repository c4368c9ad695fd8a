"""Checks of command-line input, run before any model is loaded or any output file is opened.

Why up front: a bad id or a too-long text used to fail deep inside torch (a traceback, a
62 GB allocation attempt) after the output had been opened. Every check here raises a
``UsageError`` whose one-line message names the input, what is wrong and what to do; ``mlab``
turns it into exit code 2.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from aligntools.gates.inputs import UsageError  # the one usage-error class (raised here, re-exported for the CLI)

if TYPE_CHECKING:
    from minirl import EngineSpec


def input_path(path: str, what: str, directory: bool = False) -> Path:
    """``path`` as a ``Path`` when it can be read without waiting: a regular file (or, with
    ``directory``, a directory, as a .zarr capture is), checked by ``stat`` before anything opens
    it. Why: opening a FIFO blocks until some writer appears, so ``mlab diff fifo b.nc`` hung; a
    symlink loop, a device or a socket are named as what they are, before any model loads."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as e:  # missing, a dangling link, a symlink loop (ELOOP)
        raise UsageError(f"{what} {p}: cannot read it ({e.strerror}); give an existing file") from None
    if stat.S_ISREG(mode) or (directory and stat.S_ISDIR(mode)):
        return p
    from minirl.output_paths import describe_mode

    wanted = "a file or a .zarr directory" if directory else "a file"
    raise UsageError(f"{what} {p} is {describe_mode(mode)}, not {wanted}; give {wanted}")


def checkpoint_config(path: str) -> dict:
    """config.json of a checkpoint that ``validate_checkpoint`` accepted, as a dict."""
    from aligntools.gates.inputs import validate_checkpoint

    p = validate_checkpoint(path)
    config = common_names(json.loads((p / "config.json").read_text()))  # an object: validate_checkpoint checked
    for key in ("vocab_size", "hidden_size"):
        if isinstance(config.get(key), bool) or not isinstance(config.get(key), int):
            raise UsageError(f"unreadable checkpoint {p}: config.json has no integer {key!r}")
    return config


def common_names(config: dict) -> dict:
    """``config`` with transformers' common names added where the architecture writes its own:
    GPT-2 writes ``n_embd`` / ``n_positions`` / ``n_layer`` / ``n_head``, which its config class
    reads as ``hidden_size`` / ``max_position_embeddings`` / ... (``attribute_map``). Without
    this, a checkpoint the API captures (at raw module paths) was refused here."""
    import transformers

    try:
        aliases = transformers.CONFIG_MAPPING[config.get("model_type")].attribute_map
    except (KeyError, TypeError):  # a model_type transformers does not know: its names as written
        return config
    return {**{name: config[alias] for name, alias in aliases.items() if alias in config}, **config}


def engine_spec(text: str, dtype: str | None) -> EngineSpec:
    """``--engine`` and ``--dtype`` as one checked ``EngineSpec`` with its dtype resolved: a dtype
    the engine lacks (``vllm`` + ``--dtype float64``) or two dtypes that disagree are refused here,
    before any model loads."""
    from minirl import EngineSpec

    try:
        spec = EngineSpec.parse(text)
        return spec.replace(dtype=spec.engine_dtype(dtype))
    except (ValueError, TypeError) as e:
        raise UsageError(f"--dtype {dtype} with --engine {text}: {e}" if dtype else str(e)) from e


def ids_from_json(text: str, source: str) -> list[list[int]]:
    """A JSON list of equal-length, non-empty lists of integer token ids."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{source}: not JSON ({e})") from e
    example = "expected a JSON list of token-id lists such as [[5, 6, 7], [8, 9, 10]]"
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"{source}: {example}; got {_short(rows)}")
    for r, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise UsageError(f"{source}: request {r} is {_short(row)}; {example}")
        for pos, tok in enumerate(row):
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise UsageError(f"{source}: token ids must be integers; request {r} position {pos} is {_short(tok)}")
    lengths = sorted({len(r) for r in rows})
    if len(lengths) > 1:
        raise UsageError(f"{source}: requests must be equal-length (no padding); got lengths {lengths}")
    return rows


def check_ids(rows: list[list[int]], config: dict, source: str) -> None:
    """Ids inside the vocabulary, sequences within the model's positions, memory within reach."""
    vocab = config["vocab_size"]
    for r, row in enumerate(rows):
        for pos, tok in enumerate(row):
            if not 0 <= tok < vocab:
                raise UsageError(f"{source}: token id {tok} (request {r}, position {pos}) is outside the "
                                 f"model's vocabulary [0, {vocab})")
    batch, seq = len(rows), len(rows[0])
    max_pos = config.get("max_position_embeddings")
    if isinstance(max_pos, int) and seq > max_pos:
        raise UsageError(f"{source}: {seq} tokens per request, over the model's max_position_embeddings "
                         f"{max_pos}; give at most {max_pos} tokens per request")
    need, have = forward_bytes(config, batch, seq), available_memory()
    if have is not None and need > have:
        raise UsageError(f"{source}: {batch} x {seq} tokens need about {need / 2**30:.1f} GiB for one forward "
                         f"and its capture, more than the {have / 2**30:.1f} GiB available; give fewer requests")


def forward_bytes(config: dict, batch: int, seq: int) -> int:
    """Rough peak of a float32 forward plus a tensor capture of every site: logits and the
    captured [tokens, vocab] sites, eager attention scores, ~16 hidden-sized values per layer."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    layers = int(config.get("num_hidden_layers") or 1)
    heads = int(config.get("num_attention_heads") or 1)
    tokens = batch * seq
    return 4 * (tokens * 4 * vocab + batch * heads * seq * seq * 2 + tokens * layers * 16 * hidden)


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
