"""A capture's memory goes back when the user drops it, without waiting for Python's cycle GC.

Why it matters: a capture holds the model's activations (tensor mode keeps the engine's own
tensors). Held in a reference cycle, they outlive the ``Capture`` until a full garbage
collection, so a loop of captures grows the heap by a capture's size each time and every
forward of the next capture touches fresh pages (measured: 13-18 thousand page faults, tens of
ms, per capture at hidden 512). The check: with the cycle collector saving what it finds, a
capture and its release leave no aligntools object behind.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import aligntools


def aligntools_garbage(run) -> list[str]:
    """Names of the aligntools objects (and functions) that ``run()`` left in reference cycles."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        found = [o for o in gc.garbage if _from_aligntools(o)]
        return sorted({getattr(o, "__qualname__", type(o).__qualname__) for o in found})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _from_aligntools(o: object) -> bool:
    module = getattr(o, "__module__", None) if callable(o) and hasattr(o, "__code__") else type(o).__module__
    return isinstance(module, str) and module.startswith("aligntools.")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe"])
@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_dropping_an_hf_capture_frees_it_at_once(hf_model, ids, name, mode):
    model = hf_model(name)
    assert aligntools_garbage(lambda: aligntools.capture(model, ids, mode=mode, progress=False)) == []


def test_a_tracker_kept_by_the_user_does_not_tie_up_the_capture(hf_model, ids):
    model = hf_model("tiny-llama")

    def run() -> None:
        with aligntools.Tracker(model, progress=False) as t:
            model(ids)
        assert t.capture.complete

    assert aligntools_garbage(run) == []


def test_dropping_a_minirl_or_module_path_capture_frees_it_at_once(zoo, ids):
    from minirl import Engine, Knobs

    engine = Engine.from_pretrained(zoo("tiny-llama"), knobs=Knobs.aligned())
    assert aligntools_garbage(lambda: aligntools.capture(engine, ids, progress=False)) == []
    raw = nn.Sequential(nn.Embedding(130, 8), nn.Linear(8, 130))  # its output: logits over 130 ids
    with pytest.warns(UserWarning, match="no recognisable decoder layers"):
        assert aligntools_garbage(lambda: aligntools.capture(raw, ids, progress=False)) == []


def test_compare_and_a_streamed_capture_leave_nothing_behind(hf_model, ids, tmp_path):
    model = hf_model("tiny-qwen3-moe")
    a, b = (aligntools.capture(model, ids, progress=False) for _ in range(2))
    assert aligntools_garbage(lambda: aligntools.compare(a, b)) == []
    assert aligntools_garbage(lambda: aligntools.capture(model, ids, out=tmp_path / "c.zarr", progress=False)) == []
    assert aligntools_garbage(lambda: aligntools.compare(tmp_path / "c.zarr", a)) == []
