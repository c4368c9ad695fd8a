"""Rollout records: what a framework's run leaves behind (token ids, the engine's logprobs, sampling
settings, routed experts), read into one documented ``Record`` (docs/audit.md).

``read(path)`` detects the format from the content and never runs code from the file;
``write_jsonl`` writes the canonical form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from aligntools.records.formats import from_object, read
from aligntools.records.record import Record, RecordError, validate


def write_jsonl(records: Iterable[Record], path: str | Path) -> Path:
    """Write ``records`` as JSON Lines, one record per line (``read`` reads it back)."""
    p = Path(path)
    p.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return p


__all__ = ["Record", "RecordError", "from_object", "read", "validate", "write_jsonl"]
