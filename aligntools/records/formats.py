"""``read(path)``: records from a file, its format told by its content, not its name.

Why by content: dumps are renamed and frameworks disagree on suffixes (slime writes ``.pt`` that
older versions pickled bare; verl batches travel as ``.pt``, ``.npz`` or ``.safetensors``). The first
bytes say which loader applies; every loader is one that cannot run code from the file.
"""

from __future__ import annotations

import json
import re
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path

from aligntools.records import safe_load
from aligntools.records.record import Record, RecordError
from aligntools.records.shapes import from_entry, from_verl

FORMATS = ("JSONL or JSON records", "parquet", "torch.save / pickle dicts (slime, verl)", "safetensors", "npz")
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
"""The first pickled object of a pre-1.6 (non-zip) ``torch.save`` file."""


RECORD_SUFFIXES = (".jsonl", ".json", ".parquet", ".pt", ".pth", ".pkl", ".pickle", ".safetensors", ".npz")
"""What a records folder's files may be called; anything else there (``metrics.nc``, a plot) is not read."""


def read(path: str | Path) -> list[Record]:
    """Every record in ``path`` (a file, or a folder of them as TRL's attachment, slime and verl dump
    one per step); a ``RecordError`` naming the file, the entry and the fix otherwise."""
    p = Path(path)
    if p.is_dir():
        return [r for f in folder_files(p) for r in read(f)]
    if not p.is_file():
        raise RecordError(f"{p}: no such file; give a records file ({', '.join(FORMATS)}; docs/audit.md)")
    with p.open("rb") as f:
        head = f.read(16)
    records = _read(p, head)
    if not records:
        raise RecordError(f"{p}: holds no records; write one record per sampled completion (docs/audit.md)")
    return records


def folder_files(folder: Path) -> list[Path]:
    """The records files of ``folder`` in step order (``step-2`` before ``step-10``), hidden files
    (a writer's temporaries) left out; a FIFO or device named like a records file is refused, since
    reading it would hang or never end."""
    names = sorted((f for f in folder.iterdir() if f.suffix in RECORD_SUFFIXES and not f.name.startswith(".")),
                   key=lambda f: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", f.name)])
    for f in names:
        if f.exists() and not stat.S_ISREG(f.stat().st_mode):
            raise RecordError(f"{f}: not a regular file (a FIFO or device); give a records file or remove it from "
                              f"the folder")
    if not names:
        raise RecordError(f"{folder}: a folder with no records file (named *{', *'.join(RECORD_SUFFIXES)}); give "
                          f"the folder your run wrote its rollouts to, or the files themselves (docs/audit.md)")
    return names


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
