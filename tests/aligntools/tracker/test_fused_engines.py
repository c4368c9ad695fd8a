"""vLLM/SGLang adapters' CPU-testable parts: fused-layout helpers, and the fused-module adapter
on a vLLM-style Qwen3-MoE (same paths and in-place conventions) against the hf capture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools
from aligntools.adapters.fused import FusedModuleAdapter, flat_meta, norm_outputs, rebuild_residual
from aligntools.adapters.roles import split_qkv
from tests.aligntools.tracker.vllm_style import Qwen3MoeForCausalLM


def test_split_qkv_rebuild_residual_and_norm_outputs():
    qkv = torch.arange(2 * 10.0).view(2, 10)
    q, k, v = split_qkv(qkv, 6, 2)
    assert q.shape == (2, 6) and torch.equal(v, qkv[:, 8:])
    delta, res = torch.ones(3, 4), torch.full((3, 4), 2.0)
    assert torch.equal(rebuild_residual((delta, res)), torch.full((3, 4), 3.0))
    assert torch.equal(rebuild_residual(delta), delta)
    assert norm_outputs(delta)[1] is None and norm_outputs((delta, res))[1] is res


def test_flat_meta_mixes_prefill_and_decode_rows():
    """Continuous batching: request 7 decodes (1 token) while request 3 prefills 3 tokens."""
    rows = flat_meta(torch.tensor([50, 1, 2, 3]), torch.tensor([9, 0, 1, 2]), torch.tensor([0, 1, 4]),
                     requests=[7, 3], steps=[5, 0])
    (idx0, prefill), (idx1, decode) = rows
    assert idx0.tolist() == [1, 2, 3] and prefill.step == 0 and prefill.request.tolist() == [3, 3, 3]
    assert idx1.tolist() == [0] and decode.step == 5 and decode.position.tolist() == [9]
    assert decode.token_id.tolist() == [50]


@pytest.fixture(scope="module")
def vllm_model(hf_model):
    return Qwen3MoeForCausalLM(hf_model("tiny-qwen3-moe")).eval()


def vllm_layout(args, kwargs):
    input_ids, positions, qsl = args
    n_req = len(qsl) - 1
    return flat_meta(input_ids, positions, qsl, list(range(n_req)), [0] * n_req)


def test_fused_module_map_follows_vllm_paths(vllm_model):
    plan = {p.path: p.kinds for p in FusedModuleAdapter(vllm_model, vllm_model.config, vllm_layout).plan}
    assert plan["model.layers.0.self_attn.qkv_proj"] == ("v",)
    assert plan["model.layers.0.self_attn.rotary_emb"] == ("q", "k")
    assert plan["model.layers.0.post_attention_layernorm"] == ("resid_mid", "mlp_norm")
    assert plan["model.layers.0.mlp.gate"] == ("router_logits", "topk_ids", "topk_weights")
    assert plan["model.layers.3"] == ("resid_post",) and plan["logits_processor"] == ("logits",)


def test_fused_module_capture_equals_hf_capture(vllm_model, hf_model, ids):
    adapter = FusedModuleAdapter(vllm_model, vllm_model.config, vllm_layout)
    flat, positions = ids.reshape(-1), torch.arange(7).repeat(2)
    qsl = torch.tensor([0, 7, 14])
    with aligntools.Tracker(adapter) as tracker, torch.no_grad():
        vllm_model.compute_logits(vllm_model(flat, positions, qsl)[[6, 13]])  # logits at the last tokens
    cap = tracker.capture
    ref = aligntools.capture(hf_model("tiny-qwen3-moe"), ids)
    assert set(cap.sites) == set(ref.sites)
    last = [6, 13]
    for s in ref.sites:
        a, b = cap.dataset[s].values, ref.dataset[s].values
        if s in ("logits", "entropy"):
            a, b = a[last], b[last]
        if s == "logprobs":
            assert np.isnan(a).all()  # no next token is known from last-token logits alone
        elif s.endswith("topk_ids"):
            np.testing.assert_array_equal(a, b, err_msg=s)
        else:
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-5, err_msg=s)


def test_sglang_layout_gives_a_reused_pool_slot_a_new_request(vllm_model, hf_model):
    """SGLang reuses request-pool slots: a new prefill in slot 0 must not merge with the
    request that used slot 0 before (same positions, different tokens)."""
    from types import SimpleNamespace

    from aligntools.adapters.sglang import SglangAdapter

    runner = SimpleNamespace(model=vllm_model, model_config=SimpleNamespace(hf_config=hf_model("tiny-qwen3-moe").config))
    adapter = SglangAdapter(runner)

    def batch(decode: bool, slots: list[int], ids: list[int], pos: list[int], lens: list[int]):
        mode = SimpleNamespace(is_decode=lambda: decode)
        return SimpleNamespace(forward_mode=mode, req_pool_indices=torch.tensor(slots), input_ids=torch.tensor(ids),
                               positions=torch.tensor(pos), extend_seq_lens=torch.tensor(lens))

    requests = []
    for fb in (batch(False, [0, 1], [5, 6, 7, 8], [0, 1, 0, 1], [2, 2]),  # two prefills
               batch(True, [0, 1], [9, 10], [2, 2], [1, 1]),  # one decode step each
               batch(False, [0], [11, 12], [0, 1], [2])):  # slot 0 reused by a new request
        adapter._batch = fb
        requests.append([(meta.step, sorted(set(meta.request.tolist()))) for _, meta in adapter._layout((), {})])
    assert requests[0] == [(0, [0, 1])]
    assert requests[1] == [(1, [0, 1])]
    assert requests[2] == [(0, [2])]  # a fresh id, not request 0 again


def test_streamed_capture_keeps_every_row_when_a_forward_mixes_steps(vllm_model, ids, tmp_path):
    """Continuous batching: one forward holds request 0's prefill (step 0) and request 1 at a
    decode step (step 3). Streaming with a tiny flush threshold must still write every row."""
    def mixed_layout(args, kwargs):
        input_ids, positions, qsl = args
        return flat_meta(input_ids, positions, qsl, [0, 1], [0, 3])

    adapter = FusedModuleAdapter(vllm_model, vllm_model.config, mixed_layout)
    flat, positions = ids.reshape(-1), torch.arange(7).repeat(2)
    with aligntools.Tracker(adapter, out=tmp_path / "cap.nc", flush_bytes=1) as tracker, torch.no_grad():
        vllm_model(flat, positions, torch.tensor([0, 7, 14]))
        vllm_model(flat, positions, torch.tensor([0, 7, 14]))  # a second forward: flushes the first
    cap = aligntools.Capture.load(tmp_path / "cap.nc")
    for site in ("L0.attn_norm", "L1.mlp_out", "L3.resid_post"):
        assert not np.isnan(cap.dataset[site].values).any(), site
