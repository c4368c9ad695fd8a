"""docs/rl.md's TrainConfig field table is the dataclass's: a field added, renamed, re-defaulted or
re-documented without regenerating the block fails here."""

from __future__ import annotations

import dataclasses

from minirl.training import config_reference
from minirl.training.train_config import TrainConfig


def test_docs_field_table_is_current():
    page = config_reference.DOCS.read_text()
    assert config_reference.render(page) == page, (
        "docs/rl.md's TrainConfig field table is stale: run `python -m minirl.training.config_reference`")


def test_table_lists_every_field_with_default_range_and_docstring():
    table = config_reference.table()
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines()[2:]}
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= rows.keys()
    assert "| `int` | `5` | >= 0 | write ``<out_dir>/checkpoint`` every N steps" in rows["checkpoint_every"]
    assert "`float \\| None` | `3.0` | > 1 and finite; read by `loss: ppo` | dual-clip c" in rows["dual_clip"]
    assert "Ring-1T §2.3.4" in rows["icepop_beta"]


def test_table_reads_the_registries():
    """A switch lists its registered names, and a knob the entries that read it."""
    table = config_reference.table()
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines()[2:]}
    assert "one of `icepop`, `tis`, `mis`, `none` |" in rows["correction"]
    assert "one of `ppo`, `gspo`, `espo` |" in rows["loss"] and "one of `grpo`, `drgrpo` |" in rows["advantage"]
    assert "read by `correction: tis`, `correction: mis` |" in rows["correction_level"]
