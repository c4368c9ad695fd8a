"""Tensor mode keeps transformers' tensors by reference: never a wrong value, never an alias
the engine or the caller can still write."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools
from aligntools.tracker.borrowed import CapturedValueModified
from aligntools.tracker.recorder import Recorder
from aligntools.tracker.store import MemoryStore
from aligntools.tracker.token_meta import TokenMeta

META = TokenMeta(torch.zeros(3, dtype=torch.long), torch.arange(3), torch.arange(3), 0)


def record(value: torch.Tensor, **kwargs) -> Recorder:
    rec = Recorder(["embed"], "tensor", MemoryStore({}), flush_bytes=None, progress=False, **kwargs)
    rec.emit("embed", value, META, borrow=True)
    return rec


def test_in_place_write_after_the_hook_is_an_error_naming_the_site_and_the_fix():
    value = torch.randn(3, 4)
    rec = record(value)
    value.add_(1)  # the engine reuses the tensor after the hook
    with pytest.raises(CapturedValueModified, match=r"embed: .*in place.*copy=True"):
        rec.finish({}, complete=True)


def test_copy_true_keeps_the_values_of_the_hook():
    value = torch.randn(3, 4)
    before = value.clone()
    rec = record(value, copy=True)
    value.add_(1)
    rec.finish({}, complete=True)
    assert rec.dataset()["embed"].values.tobytes() == before.numpy().tobytes()


def test_a_sole_reference_becomes_the_capture_without_a_copy_and_a_shared_one_is_copied():
    value = torch.randn(3, 4)
    ptr = value.data_ptr()
    rec = record(value)
    del value  # the engine dropped it: the capture owns the memory now
    rec.finish({}, complete=True)
    assert rec.dataset()["embed"].values.__array_interface__["data"][0] == ptr

    held = torch.randn(3, 4)
    before = held.clone()
    rec = record(held)
    rec.finish({}, complete=True)
    held.zero_()  # written after the capture was finished: the capture must not see it
    assert rec.dataset()["embed"].values.tobytes() == before.numpy().tobytes()


def test_inference_tensors_have_no_version_counter_and_are_copied():
    with torch.inference_mode():
        value = torch.randn(3, 4)
        before = value.clone()
        rec = record(value)
        value.add_(1)
    rec.finish({}, complete=True)
    assert rec.dataset()["embed"].values.tobytes() == before.numpy().tobytes()


def test_budget_downgrade_checks_borrowed_values_before_reducing_them():
    value = torch.randn(3, 4)
    rec = Recorder(["embed", "final_norm"], "tensor", MemoryStore({}), budget_bytes=60, on_budget="stats",
                   flush_bytes=None, progress=False)
    rec.emit("embed", value, META, borrow=True)
    value.mul_(2)
    with pytest.raises(CapturedValueModified, match="embed"):
        rec.emit("final_norm", torch.randn(3, 4), META)  # over budget: reduces what was captured


def test_transformers_model_writing_a_captured_output_in_place(hf_model, ids):
    model = hf_model("tiny-llama")
    seen = {}

    def double_input(module, args):  # layer 1 scales its input (L0.resid_post) in place
        seen["L0"] = args[0].clone()
        args[0].mul_(2)

    handle = model.model.layers[1].register_forward_pre_hook(double_input)
    try:
        with pytest.raises(CapturedValueModified, match="L0.resid_post"):
            aligntools.capture(model, ids, "L0.resid_post", progress=False)
        got = aligntools.capture(model, ids, "L0.resid_post", progress=False, copy=True)
    finally:
        handle.remove()
    want = seen["L0"].reshape(-1, got.dataset["L0.resid_post"].shape[1]).numpy()
    assert np.array_equal(got.dataset["L0.resid_post"].values, want)


def test_copy_must_be_a_bool(hf_model):
    with pytest.raises(ValueError, match="copy must be True or False"):
        aligntools.Tracker(hf_model("tiny-llama"), copy="yes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_references_capture_the_bytes_copies_capture(zoo, ids, dtype):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(zoo("tiny-llama"), dtype=dtype).eval()
    kept = aligntools.capture(model, ids, progress=False).dataset
    copied = aligntools.capture(model, ids, progress=False, copy=True).dataset
    assert list(kept.variables) == list(copied.variables)
    for name in kept.variables:
        a, b = kept[name].values, copied[name].values
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
