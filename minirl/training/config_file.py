"""The one reader of YAML config text: ``mlab train --config`` and ``--set``, ``TrainConfig.from_yaml``
and the plot's ``config.yaml`` of a run all go through ``read_config_file`` / ``parse_yaml``.

Why not ``yaml.safe_load``: "safe" there means no Python objects, not bounded. A 757-byte file of
nested aliases (a billion laughs) expanded to gigabytes, 20,000 nested brackets ended in a
RecursionError, ``--config /dev/zero`` read until memory ran out, and a key given twice
(``steps: 2`` then ``steps: 100000``) silently took the last value. A config is a short, flat
file written by hand, so this reader refuses what no config needs: anchors and aliases (``&``,
``*``), duplicate keys, nesting deeper than ``MAX_DEPTH``, more than ``MAX_BYTES``, and anything
that is not a regular file. Every refusal names the file (and the line, where there is one).
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
    loader = _Loader(text, where)
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
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise ValueError(f"{self.where}: line {line}: key {short(key)} is given twice (first on line "
                                     f"{seen[key]}); keep one")
                seen[key] = line
            except TypeError:  # an unhashable key: the base class says so
                continue
        return super().construct_mapping(node, deep)
