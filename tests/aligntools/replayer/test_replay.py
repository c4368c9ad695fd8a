"""Replay one module on its captured inputs: ~0 under the engine's own implementation, the
module's own error under another one."""

from __future__ import annotations

import pytest
import torch
import transformers

from aligntools import Capture, capture, replay

SITES = "embed,L*.resid_mid,L*.resid_post,L*.attn_norm,L*.mlp_norm,L1.q,L1.k,L1.router_logits,L1.topk_*,final_norm,logits"


@pytest.fixture(scope="module")
def hf_capture(moe):
    model = transformers.AutoModelForCausalLM.from_pretrained(moe, dtype=torch.float32).eval()
    ids = torch.arange(3, 3 + 2 * 24).view(2, 24)
    return capture(model, ids, sites=SITES), model


@pytest.mark.parametrize("site", ["L0.attn_norm", "L2.mlp_norm", "final_norm"])
def test_rmsnorm_replay_matching_is_exact_bf16_compute_is_not(hf_capture, moe, site):
    cap, _ = hf_capture
    assert replay(cap, site, "hf", model=moe).errors["max_abs"] == 0.0
    bad = replay(cap, site, "bf16_compute", model=moe)
    assert 1e-4 < bad.errors["rel_l2"] < 3e-2  # bf16 roundings: a few 2**-9, no more
    assert bad.output.shape == cap[site].shape


def test_replay_takes_the_weights_from_a_model_object(hf_capture):
    cap, model = hf_capture
    assert replay(cap, "L1.attn_norm", "hf", model=model).errors["max_abs"] == 0.0


def test_replay_finds_the_checkpoint_through_the_capture_attrs(hf_capture, moe, tmp_path):
    cap, _ = hf_capture
    assert cap.dataset.attrs["model_path"] == str(moe)
    cap.save(tmp_path / "cap.nc")  # readable without the model: the path travels with the file
    loaded = type(cap).load(tmp_path / "cap.nc")
    assert replay(loaded, "L1.attn_norm", "hf").errors["max_abs"] == 0.0


def test_rope_router_and_lm_head_replays(hf_capture, moe):
    cap, _ = hf_capture
    assert replay(cap, "L1.q", "hf", model=moe).errors["rel_l2"] < 1e-6
    assert replay(cap, "L1.k", "bfloat16", model=moe).errors["rel_l2"] > 1e-4
    assert replay(cap, "L1.router_logits", "float32", model=moe).errors["rel_l2"] < 1e-6
    assert replay(cap, "L1.topk_ids", "stable", model=moe).errors["set_flip"] == 0.0
    assert replay(cap, "logits", "bfloat16", model=moe).errors["rel_l2"] > 1e-4


def test_unsupported_site_lists_the_supported_ones(hf_capture, moe):
    cap, _ = hf_capture
    with pytest.raises(ValueError, match="supported sites: .*L\\{i\\}.attn_norm"):
        replay(cap, "L0.attn_out", "hf", model=moe)
    with pytest.raises(ValueError, match="variants"):
        replay(cap, "L0.attn_norm", "nope", model=moe)
    anonymous = cap.dataset.copy()
    del anonymous.attrs["model_path"]
    with pytest.raises(ValueError, match="model="):
        replay(Capture(anonymous), "L0.attn_norm", "hf")


def test_replay_reproduces_an_inference_engine_capture(moe):
    from minirl import Engine, Knobs

    knobs = Knobs.typical_inference()
    cap = capture(Engine.from_pretrained(moe, dtype="bfloat16", knobs=knobs), torch.arange(3, 51).view(2, 24),
                  progress=False)
    for site, impl in [("L1.attn_norm", knobs.rmsnorm), ("L1.q", knobs.rope), ("L1.topk_ids", knobs.topk)]:
        errors = replay(cap, site, impl, model=moe).errors
        assert errors.get("max_abs", errors.get("set_flip")) == 0.0, (site, errors)
    assert replay(cap, "L1.attn_norm", "bf16_compute", model=moe).errors["rel_l2"] > 1e-4


def test_topk_replay_refuses_a_sigmoid_routed_model(zoo):
    from minirl import Engine, Knobs

    path = zoo("tiny-ring-linear")
    engine = Engine.from_pretrained(path, dtype="float32", knobs=Knobs.aligned())
    cap = capture(engine, torch.arange(3, 15).view(1, 12), sites="L1.router_logits,L1.topk_ids")
    with pytest.raises(ValueError, match="softmax routers"):
        replay(cap, "L1.topk_ids", "stable", model=path)
