"""``mode: sync`` and ``async`` share one run lifecycle (``minirl.training.lifecycle``): the same
artefacts, evaluation schedule and resume rules (``ray``: ``tests/minirl/scale_out/test_ray_lifecycle.py``)."""

from __future__ import annotations

import pytest

from tests.minirl.training.lifecycle_checks import check_lifecycle


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_mode_is_a_first_class_run(zoo, tmp_path, mode):
    check_lifecycle(str(zoo("tiny-qwen3")), tmp_path / "run", mode)
