"""The one reader of YAML config text: ``mlab train --config`` and ``--set``, ``TrainConfig.from_yaml``
and the plot's ``config.yaml`` of a run all go through ``read_config_file`` / ``parse_yaml``.

Why not ``yaml.safe_load``: "safe" there means no Python objects, not bounded. A 757-byte file of
nested aliases (a billion laughs) expanded to gigabytes, 20,000 nested brackets ended in a
RecursionError, ``--config /dev/zero`` read until memory ran out, and a key given twice
(``steps: 2`` then ``steps: 100000``) silently took the last value. A config is a short, flat
file written by hand, so this reader refuses what no config needs: anchors and aliases (``&``,
``*``), duplicate keys, nesting deeper than ``MAX_DEPTH``, more than ``MAX_BYTES``, and anything
that is not a regular file. Every refusal names the file (and the line, where there is one).

It also refuses what YAML 1.1 reads as something else than the author meant: a leading-zero
integer (``seed: 017`` is octal, 15), merge keys (``<<: {steps: 1}`` beside ``steps: 100000``: which
one wins is a rule of the spec no reader of the file remembers), and a control character (a NUL
pasted in); and it keeps ``1:`` and ``true:`` apart (Python's ``1 == True`` made them one key).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from minirl.training.config_check import short

MAX_BYTES = 1 << 20
"""1 MiB: a TrainConfig of every key is about 3 KB; a larger file is not a config."""
MAX_DEPTH = 32
"""Nesting levels of mappings and lists: a config is flat, ``task_kwargs`` adds a level or two."""


def read_config_file(path: str | os.PathLike) -> dict:
    """The mapping of a YAML config file, read through ``parse_yaml``; ``ValueError`` naming the
    file for anything else (not a regular file, over ``MAX_BYTES``, not UTF-8, not a mapping)."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{p}: not a regular file (a directory, device or pipe); give a YAML config file")
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{p}: cannot read it ({e.strerror or e})") from e
    if len(data) > MAX_BYTES:
        raise ValueError(f"{p}: larger than {MAX_BYTES >> 20} MiB, far more than any config; give a YAML file "
                         f"of config keys")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); give a YAML config file") from None
    values = parse_yaml(text, str(p))
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"{p}: expected a mapping of config keys (key: value lines), got {type(values).__name__}")
    return values


def parse_yaml(text: str, where: str) -> object:
    """``text`` as YAML data (plain values, lists, mappings), refusing anchors and aliases,
    duplicate keys and deep nesting; ``where`` (a file, ``--set lr=...``) starts every message."""
    try:
        loader = _Loader(text, where)
    except yaml.reader.ReaderError as e:  # the reader checks every character when it is built
        line = text.count("\n", 0, e.position) + 1
        raise ValueError(f"{where}: line {line}: a control character ({e.character:#06x}) YAML does not "
                         f"accept; remove it (a config is plain text)") from None
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None
    finally:
        loader.dispose()


class _Loader(yaml.SafeLoader):
    """``SafeLoader`` that refuses, while composing (before anything is expanded), what
    ``parse_yaml`` refuses."""

    def __init__(self, text: str, where: str) -> None:
        super().__init__(text)
        self.where, self.depth = where, 0
        self.keys: dict[yaml.Node, object] = {}  # a mapping's value node -> its key (nodes hash by identity)

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ValueError(f"{self.where}: line {line}: YAML anchors and aliases (& and *) are not accepted in "
                             f"a config (a few bytes of them can expand to gigabytes); write the values out")
        if self.depth >= MAX_DEPTH:
            raise ValueError(f"{self.where}: line {line}: nested too deep (more than {MAX_DEPTH} levels of "
                             f"lists and mappings); a config is flat key: value lines")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict[tuple[type, object], int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise ValueError(f"{self.where}: line {line}: merge keys (<<) are not accepted in a config (which "
                                 f"value wins is a YAML rule, not what the file shows); write each key once")
            key = self.construct_object(key_node, deep=True)
            self.keys[value_node] = key  # the int constructor names the key of a value it refuses
            try:
                if (type(key), key) in seen:  # the type too: 1 and true are two keys, though 1 == True
                    raise ValueError(f"{self.where}: line {line}: key {short(key)} is given twice (first on line "
                                     f"{seen[type(key), key]}); keep one")
                seen[type(key), key] = line
            except TypeError:  # an unhashable key: the base class says so
                continue
        return super().construct_mapping(node, deep)

    def construct_leading_zero_checked_int(self, node):
        """YAML 1.1's int, refusing ``017`` (octal there, 15; read as 17 by anyone else)."""
        digits = str(node.value).lstrip("+-").replace("_", "")
        if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXbB":
            key = self.keys.get(node)
            key = f"{key}=" if isinstance(key, str) and len(key) <= 60 else "" if key is None else f"{short(key)}="
            raise ValueError(f"{self.where}: line {node.start_mark.line + 1}: {key}{node.value} has a leading zero, "
                             f"which YAML reads as octal ({self.construct_yaml_int(node)}); write it without the "
                             f"zero, or quote it for a string")
        return self.construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_leading_zero_checked_int)
