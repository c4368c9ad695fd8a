"""minirl.families: each entry is a real transformers family, and the transforms are the models' own."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig

from minirl import families as F
from tests.families import tiny


def test_every_family_tested_has_an_entry():
    assert set(tiny.FAMILIES) <= set(F.FAMILIES)


def test_an_unknown_family_is_llama_shaped_with_nothing_scaled():
    assert F.family(None) is F.DEFAULT and F.family(AutoConfig.for_model("llama")).block == "pre_norm"
    assert F.embed_scale(AutoConfig.for_model("llama")) is None
    assert F.logits_transform(AutoConfig.for_model("llama")).identity


def test_the_quirks_read_from_the_config():
    gemma = AutoConfig.for_model("gemma2", hidden_size=128, final_logit_softcapping=30.0)
    assert F.embed_scale(gemma) == math.sqrt(128) and F.logits_transform(gemma).softcap == 30.0
    assert F.family(gemma).mlp_norm_names == ("pre_feedforward_layernorm",)
    granite = AutoConfig.for_model("granite", logits_scaling=8.0, embedding_multiplier=12.0)
    assert F.embed_scale(granite) == 12.0 and F.logits_transform(granite).divide == 8.0
    assert F.family(AutoConfig.for_model("cohere")).mlp_norm_names is None  # parallel block: no MLP norm
    assert F.expert_count({"n_routed_experts": 4}) == 4 and F.expert_count({"hidden_size": 8}) is None


def test_the_logits_transform_is_what_the_model_writes():
    z = torch.randn(4, 7) * 50
    assert torch.equal(F.LogitsTransform(divide=8.0).apply(z), z / 8.0)
    assert torch.equal(F.LogitsTransform(multiply=0.0625).apply(z), z * 0.0625)
    capped = F.LogitsTransform(softcap=30.0).apply(z)
    assert torch.equal(capped, torch.tanh(z / 30.0) * 30.0) and capped.abs().max() < 30.0
    assert F.LogitsTransform().apply(z) is z


@pytest.mark.parametrize("model_type", ["gemma2", "granite", "cohere"])
def test_hf_capture_reads_what_the_model_computes(model_type, family_checkpoint):
    """``embed`` is what layer 0 takes as input, ``logits`` what ``model(ids).logits`` returns."""
    import aligntools
    from minirl.engines import load_hf

    model = load_hf(family_checkpoint(model_type), "float32")
    ids = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(0))
    seen = {}

    def layer_input(module, args, kwargs) -> None:
        seen["in"] = args[0] if args else kwargs["hidden_states"]

    hook = model.model.layers[0].register_forward_pre_hook(layer_input, with_kwargs=True)
    cap = aligntools.capture(model, ids, sites=["embed", "logits"], progress=False)
    hook.remove()
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.equal(torch.as_tensor(cap.dataset["embed"].values), seen["in"].reshape(-1, 128))
    assert torch.equal(torch.as_tensor(cap.dataset["logits"].values), logits.reshape(-1, logits.shape[-1]))


@pytest.mark.parametrize("model_type", ["llama", "phi3", "stablelm", "gpt_neox"])
def test_q_k_v_are_what_the_attention_computes_with(model_type, family_checkpoint):
    """``q``/``k`` after RoPE and ``v`` are the tensors handed to the attention kernel, read there
    (eager attention's ``eager_attention_forward``, wrapped): Phi-3's and GPT-NeoX's fused
    projections split as each lays them out ([q | k | v] vs per head [q_h | k_h | v_h]) and
    StableLM's RoPE on the first quarter of each head with the rest concatenated after."""
    import sys

    import aligntools
    from minirl.engines import load_hf

    model = load_hf(family_checkpoint(model_type), "float32", attn="eager")
    modeling = sys.modules[type(model).__module__]
    seen, original = [], modeling.eager_attention_forward

    def spy(module, query, key, value, *args, **kwargs):  # [B, heads, S, D] each
        seen.append({"q": query, "k": key, "v": value})
        return original(module, query, key, value, *args, **kwargs)

    ids = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(0))
    modeling.eager_attention_forward = spy
    try:
        cap = aligntools.capture(model, ids, sites=["L0.q", "L0.k", "L0.v", "L1.v"], progress=False)
    finally:
        modeling.eager_attention_forward = original
    for layer, kind in (("L0", "q"), ("L0", "k"), ("L0", "v"), ("L1", "v")):
        truth = seen[int(layer[1])][kind].transpose(1, 2).reshape(18, -1)  # [B*S, heads*D]
        assert torch.equal(torch.as_tensor(cap.dataset[f"{layer}.{kind}"].values), truth), (layer, kind)
