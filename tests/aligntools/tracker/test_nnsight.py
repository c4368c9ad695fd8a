"""nnsight interop on a zoo model: an nnsight model as a target, and saved values -> Capture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools
from aligntools.adapters.nnsight_interop import from_nnsight, trace_sites

pytest.importorskip("nnsight")


@pytest.fixture(scope="module")
def nn_model(zoo):
    from nnsight.modeling.transformers import TransformersModel

    return TransformersModel(str(zoo("tiny-qwen3-moe")), task="text-generation", dispatch=True)


def test_nnsight_model_as_tracker_target(nn_model, hf_model, ids):
    with aligntools.Tracker(nn_model, sites="L*.resid_post,L1.q,logits") as t:
        with nn_model.trace(ids):
            pass
    ref = aligntools.capture(hf_model("tiny-qwen3-moe"), ids, sites="L*.resid_post,L1.q,logits")
    assert t.capture.engine == "hf" and t.capture.sites == ref.sites
    for s in ref.sites:
        np.testing.assert_array_equal(t.capture.dataset[s].values, ref.dataset[s].values, err_msg=s)


def test_values_saved_in_a_trace_become_a_capture(nn_model, hf_model, ids):
    saved = trace_sites(nn_model, ids)
    assert "L0.q" not in saved and "L2.topk_ids" in saved  # RoPE is not a module nnsight can see
    cap = from_nnsight(saved, ids, model=nn_model._module)
    ref = aligntools.capture(hf_model("tiny-qwen3-moe"), ids)
    assert set(cap.sites) == set(ref.sites) - {f"L{i}.{k}" for i in range(4) for k in ("q", "k")}
    for s in cap.sites:
        np.testing.assert_array_equal(cap.dataset[s].values, ref.dataset[s].values, err_msg=s)
    assert cap.dataset.attrs["model_hash"] == ref.dataset.attrs["model_hash"]


def test_from_nnsight_rejects_non_tensors(ids):
    with pytest.raises(TypeError, match="save output\\[0\\]"):
        from_nnsight({"L0.resid_post": (torch.zeros(2, 7, 4),)}, ids)
