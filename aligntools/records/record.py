"""The rollout record: one sample per entry, as docs/audit.md documents it.

Why one record: verl, slime/Miles, vLLM and SGLang each leave token ids and the engine's per-token
logprobs behind in their own shape; every reader turns its shape into this one, and ``validate``
is the single place that says what is wrong with an entry, which file and entry it is, and how to
fix it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty")
LOGPROBS_MODES = ("raw", "processed")
REQUIRED = ("prompt_ids", "completion_ids", "logprobs")
OPTIONAL = ("sampling", "logprobs_mode", "routed_experts", "step")


class RecordError(ValueError):
    """A record file or entry the audit cannot read; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class Record:
    """One sampled completion as the engine produced it.

    ``routed_experts``: int array [rows, layers, top_k], one row per token of prompt + completion;
    the last row may be missing (vLLM returns none for the final sampled token, it was never fed in).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    sampling: Mapping[str, float] = field(default_factory=dict)
    logprobs_mode: str | None = None
    routed_experts: np.ndarray | None = None
    step: int | str | None = None

    def to_json(self) -> dict:
        """The JSONL form of this record (what ``read`` reads back)."""
        out: dict = {"prompt_ids": list(self.prompt_ids), "completion_ids": list(self.completion_ids),
                     "logprobs": list(self.logprobs)}
        if self.sampling:
            out["sampling"] = dict(self.sampling)
        if self.logprobs_mode is not None:
            out["logprobs_mode"] = self.logprobs_mode
        if self.routed_experts is not None:
            out["routed_experts"] = self.routed_experts.tolist()
        if self.step is not None:
            out["step"] = self.step
        return out


def validate(entry: object, where: str) -> Record:
    """``entry`` (a mapping with the documented fields) as a ``Record``, else a ``RecordError``
    beginning with ``where`` (``"file.jsonl: entry 3"``) that names the field and the fix."""
    if not isinstance(entry, Mapping):
        raise RecordError(f"{where}: is a {type(entry).__name__}, not an object with fields {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise RecordError(f"{where}: missing {', '.join(missing)}; every record needs {', '.join(REQUIRED)} "
                          f"(docs/audit.md); it has {', '.join(sorted(map(str, entry))) or 'no fields'}")
    unknown = sorted(set(map(str, entry)) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise RecordError(f"{where}: unknown field(s) {', '.join(unknown)}; a record has {', '.join(REQUIRED + OPTIONAL)}")
    prompt = _ids(entry["prompt_ids"], f"{where}: prompt_ids", allow_empty=False)
    completion = _ids(entry["completion_ids"], f"{where}: completion_ids", allow_empty=False)
    logprobs = _logprobs(entry["logprobs"], len(completion), f"{where}: logprobs")
    return Record(prompt, completion, logprobs, sampling=_sampling(entry.get("sampling"), f"{where}: sampling"),
                  logprobs_mode=_mode(entry.get("logprobs_mode"), f"{where}: logprobs_mode"),
                  routed_experts=_experts(entry.get("routed_experts"), len(prompt) + len(completion),
                                          f"{where}: routed_experts"),
                  step=_step(entry.get("step"), f"{where}: step"))


def _ids(value: object, where: str, allow_empty: bool) -> tuple[int, ...]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or (not value and not allow_empty):
        raise RecordError(f"{where}: expected a non-empty list of integer token ids, got {_short(value)}")
    for i, tok in enumerate(value):
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise RecordError(f"{where}: position {i} is {_short(tok)}; token ids are integers >= 0")
    return tuple(value)


def _logprobs(value: object, n: int, where: str) -> tuple[float, ...]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise RecordError(f"{where}: expected a list of floats, one per completion token, got {_short(value)}")
    if len(value) != n:
        raise RecordError(f"{where}: {len(value)} values for {n} completion tokens; give one logprob per completion "
                          "token (the engine's logprob of the token it sampled), no prompt logprobs")
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x) or x > 1e-6:
            raise RecordError(f"{where}: position {i} is {_short(x)}; a logprob is a number <= 0 "
                              "(pass log-probabilities, not probabilities or logits)")
    return tuple(float(x) for x in value)


def _sampling(value: object, where: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RecordError(f"{where}: expected an object such as {{\"temperature\": 1.0, \"top_p\": 1.0}}, "
                          f"got {_short(value)}")
    unknown = sorted(set(map(str, value)) - set(SAMPLING_KEYS))
    if unknown:
        raise RecordError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(SAMPLING_KEYS)}")
    bad = [k for k, v in value.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
    if bad:
        raise RecordError(f"{where}: {bad[0]} is {_short(value[bad[0]])}; sampling settings are numbers")
    return {k: float(v) for k, v in value.items() if v is not None}


def _mode(value: object, where: str) -> str | None:
    if value is not None and value not in LOGPROBS_MODES:
        raise RecordError(f"{where}: {_short(value)}; use 'raw' (before temperature/top-p) or 'processed' (after)")
    return value  # type: ignore[return-value]


def _experts(value: object, tokens: int, where: str) -> np.ndarray | None:
    if value is None:
        return None
    try:
        arr = np.asarray(value)
    except ValueError as e:  # ragged nesting
        raise RecordError(f"{where}: rows of unequal shape ({e}); give [tokens][layers][top_k] expert ids") from e
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.integer):
        raise RecordError(f"{where}: expected integer expert ids shaped [tokens][layers][top_k], got an array "
                          f"of shape {arr.shape} and dtype {arr.dtype}")
    if arr.shape[0] not in (tokens, tokens - 1):
        raise RecordError(f"{where}: {arr.shape[0]} rows for {tokens} prompt + completion tokens; give one row per "
                          "token (the last row may be missing, as vLLM returns it)")
    if (arr < 0).any():
        raise RecordError(f"{where}: negative expert id {int(arr.min())}; expert ids are >= 0")
    return arr.astype(np.int64)


def _step(value: object, where: str) -> int | str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
        raise RecordError(f"{where}: {_short(value)}; a step is an integer (training step) or a string (weight version)")
    return value  # type: ignore[return-value]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
