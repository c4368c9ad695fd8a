"""The HF capture of families outside the table whose attention is not Llama-shaped: gpt2
(``c_attn``, a Conv1D: no decoder roles, module-path sites), BLOOM (``query_key_value`` per head
``[q_h | k_h | v_h]``, head size ``head_dim``) and Falcon's new decoder architecture (per kv head
``[q heads of the group | k | v]``; its parallel block adds the attention output into the MLP's
in place). Each gives named sites, never an ``AttributeError`` on ``head_size`` or a borrowed
value overwritten; the ``v`` site is the v the model's own split hands its attention."""

from __future__ import annotations

import pytest
import torch

import aligntools
from minirl.engines import load_hf
from tests.families.conftest import family_checkpoint  # noqa: F401 (a fixture: the tiny family checkpoints)

IDS = torch.randint(3, 500, (2, 8), generator=torch.Generator().manual_seed(0))


def own_split_v(model_type: str, attn: torch.nn.Module, fused: torch.Tensor) -> torch.Tensor:
    """v [B, S, kv_heads * head] as the model's attention splits ``fused`` (its query_key_value output)."""
    if model_type == "bloom":
        return attn._reshape(fused)[2].transpose(1, 2).flatten(2)  # [B, heads, S, D]
    v = attn._split_heads(fused)[2]  # Falcon: [B, S, heads, D], each kv head's v repeated over its group
    return v.unflatten(2, (attn.num_kv_heads, -1))[:, :, :, 0].flatten(2)


@pytest.mark.parametrize("model_type", ["bloom", "falcon"])
def test_fused_query_key_value_gives_the_v_the_attention_uses(model_type, family_checkpoint):
    model = load_hf(family_checkpoint(model_type), "float32")
    cap = aligntools.capture(model, IDS, progress=False)
    assert {"L0.v", "L1.v", "L1.attn_out", "L1.mlp_out", "L1.resid_post", "logits"} <= set(cap.sites)
    attn = model.transformer.h[1].self_attention
    seen = {}
    handle = attn.query_key_value.register_forward_hook(lambda m, a, out: seen.setdefault("qkv", out))
    with torch.no_grad():
        logits = model(IDS).logits
    handle.remove()
    want = own_split_v(model_type, attn, seen["qkv"]).flatten(0, 1)  # token rows
    got = torch.from_numpy(cap.dataset["L1.v"].values)
    assert got.shape == want.shape and torch.equal(got, want)
    assert torch.equal(torch.from_numpy(cap.dataset["logits"].values), logits.reshape(-1, logits.shape[-1]))


def test_gpt2_is_captured_by_module_path(family_checkpoint):
    model = load_hf(family_checkpoint("gpt2"), "float32")
    cap = aligntools.capture(model, IDS, progress=False)
    assert {"transformer.h.0.attn", "transformer.h.1.mlp", "transformer.ln_f", "logits"} <= set(cap.sites)
    with torch.no_grad():
        logits = model(IDS).logits
    assert torch.equal(torch.from_numpy(cap.dataset["logits"].values), logits.reshape(-1, logits.shape[-1]))
