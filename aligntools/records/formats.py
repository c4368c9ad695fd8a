"""``read(path)``: records from a file, its format told by its content, not its name.

Why by content: dumps are renamed and frameworks disagree on suffixes (slime writes ``.pt`` that
older versions pickled bare; verl batches travel as ``.pt``, ``.npz`` or ``.safetensors``). The first
bytes say which loader applies; every loader is one that cannot run code from the file.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

from aligntools.records import safe_load
from aligntools.records.record import Record, RecordError
from aligntools.records.shapes import from_entry, from_verl

FORMATS = ("JSONL or JSON records", "parquet", "torch.save / pickle dicts (slime, verl)", "safetensors", "npz")
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
"""The first pickled object of a pre-1.6 (non-zip) ``torch.save`` file."""


def read(path: str | Path) -> list[Record]:
    """Every record in ``path``; a ``RecordError`` naming the file, the entry and the fix otherwise."""
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"{p}: no such file; give a records file ({', '.join(FORMATS)}; docs/audit.md)")
    with p.open("rb") as f:
        head = f.read(16)
    records = _read(p, head)
    if not records:
        raise RecordError(f"{p}: holds no records; write one record per sampled completion (docs/audit.md)")
    return records


def _read(p: Path, head: bytes) -> list[Record]:
    if head.startswith(b"PAR1"):
        return _parquet(p)
    if head.startswith(b"PK\x03\x04"):
        names = zipfile.ZipFile(p).namelist()
        if any(n.endswith("data.pkl") for n in names):
            return from_object(safe_load.load_torch(p), str(p))
        return from_object(safe_load.load_npz(p), str(p))
    if head[:1] == b"\x80":
        obj = safe_load.load_pickle(p)
        return from_object(safe_load.load_torch(p) if obj == TORCH_LEGACY_MAGIC else obj, str(p))
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < p.stat().st_size:
        return from_object(safe_load.load_safetensors(p), str(p))
    return _text(p)


def from_object(obj: object, source: str) -> list[Record]:
    """Records from a loaded object: a list of entries, a slime pack ``{"rollout_id", "samples"}``,
    a verl batch dict, or one record."""
    if isinstance(obj, list):
        return [r for i, e in enumerate(obj) for r in from_entry(e, f"{source}: entry {i}")]
    if isinstance(obj, Mapping) and "samples" in obj:
        step = obj.get("rollout_id")
        return [r for i, e in enumerate(obj["samples"]) for r in from_entry(e, f"{source}: sample {i}", step)]
    if isinstance(obj, Mapping) and "rollout_log_probs" in obj:
        return from_verl(obj, source)
    if isinstance(obj, Mapping):
        return from_entry(obj, f"{source}: entry 0")
    raise RecordError(f"{source}: holds a {type(obj).__name__}; expected a list of records, a slime "
                      "--save-debug-rollout-data file or a verl batch dict (docs/audit.md)")


def _text(p: Path) -> list[Record]:
    try:
        text = p.read_text()
    except UnicodeDecodeError as e:
        raise RecordError(f"{p}: not a known records format ({', '.join(FORMATS)}): not UTF-8 text "
                          f"and no known binary header") from e
    try:
        return from_object(json.loads(text), str(p))
    except json.JSONDecodeError:
        pass  # not one JSON document: JSON Lines
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecordError(f"{p}: line {n}: not JSON ({e.msg}); write one JSON record per line") from e
        records += from_entry(entry, f"{p}: line {n}")
    return records


def _parquet(p: Path) -> list[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise RecordError(f"{p}: a parquet file, and pyarrow is not installed; pip install pyarrow, or write "
                          "the records as JSONL") from e
    try:
        rows = pq.read_table(p).to_pylist()
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise RecordError(f"{p}: not a readable parquet file ({e})") from e
    return [r for i, row in enumerate(rows)
            for r in from_entry({k: v for k, v in row.items() if v is not None}, f"{p}: row {i}")]
