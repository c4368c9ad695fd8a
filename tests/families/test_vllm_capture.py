"""vLLM float32 against transformers float32, family by family: the same sites, the same values.

Each site means one thing on both engines (minirl/families.py): a Gemma embedding scaled on one
side only, Granite/Cohere logits read before their scaling, a Cohere/StableLM residual added
twice, or a Gemma 2/3 sandwich norm mapped to the wrong module would each fail here. The
transformers capture runs first: vLLM's Transformers backend (olmo2) rebuilds that family's
classes while it builds its engine (``minirl.vllm.llm`` puts them back; the gate captures in
this order too). Dense Llama and Qwen3-MoE are in tests/vllm/test_alignment.py.
"""

from __future__ import annotations

import gc

import pytest
import torch

import aligntools
from minirl.engines import load_hf
from tests.families.conftest import NOT_SERVED, families
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm
SERVED_ELSEWHERE = ("llama", "qwen3_moe")  # tests/vllm/test_alignment.py


@pytest.mark.parametrize("model_type", families(fast=("gemma2", "granite", "olmo2"), skip=SERVED_ELSEWHERE + NOT_SERVED))
def test_vllm_fp32_matches_transformers_at_every_site(model_type, family_checkpoint):
    from minirl.vllm.llm import create_llm

    path = family_checkpoint(model_type)
    ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    hf = aligntools.capture(load_hf(path, "float32"), ids, progress=False)
    llm = create_llm(path, "float32", max_model_len=64)
    cap = aligntools.capture(llm, ids, progress=False)
    del llm
    gc.collect()
    assert sorted(cap.sites) == sorted(hf.sites)
    cmp = aligntools.compare(hf, cap)
    incomparable = [s for s, r in cmp.results.items() if not r.comparable]
    assert not incomparable, incomparable  # a shape apart (StableLM's q/k were its rotated quarter only)
    worst = max(r.summary.get("rel_l2", 0.0) for r in cmp.results.values())
    assert cmp.passes and worst < 1e-5, cmp.table.loc[cmp.failures, ["rel_l2", "limit"]]
    # transformers still loads this family after vLLM built it (no family breaks another)
    assert len(aligntools.capture(load_hf(path, "float32"), ids[:1], sites=["logits"], progress=False).sites)


@pytest.mark.parametrize("model_type", NOT_SERVED)
def test_a_family_vllm_cannot_run_here_is_refused_by_name_before_it_starts(model_type, family_checkpoint):
    from minirl.vllm.llm import check_model

    with pytest.raises(ValueError, match=r"head_dim=16 is not supported by vLLM's CPU attention"):
        check_model(family_checkpoint(model_type))


@pytest.mark.parametrize("n_embd,n_head,refused", [(64, 4, True), (128, 4, False)])
def test_a_gpt2_style_config_is_read_not_a_key_error(n_embd, n_head, refused, tmp_path):
    """gpt2's config names its width ``n_embd`` and its heads ``n_head``; check_model reads them as
    transformers does (head 16: refused by name; head 32: served), never ``KeyError: 'hidden_size'``."""
    import transformers

    from minirl.vllm.llm import check_model

    transformers.GPT2Config(n_embd=n_embd, n_head=n_head, n_layer=1, vocab_size=64,
                            architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    if refused:
        with pytest.raises(ValueError, match=r"head_dim=16 is not supported"):
            check_model(tmp_path)
    else:
        check_model(tmp_path)


@pytest.mark.parametrize("model_type", ["phi", pytest.param("olmo", marks=pytest.mark.slow),
                                        pytest.param("hunyuan_v1_dense", marks=pytest.mark.slow)])
def test_a_family_vllm_serves_with_transformers_classes_still_runs_in_transformers(model_type, family_checkpoint):
    """vLLM's Transformers backend decorates the family's transformers class in place; whichever
    family its registry sends there (not only the table's), ``create_llm`` puts the class back:
    the same transformers model built after the engine computes the same logits, bit for bit."""
    from minirl.vllm.llm import _served_by_transformers_backend, create_llm

    path = family_checkpoint(model_type)
    model = load_hf(path, "float32")
    assert _served_by_transformers_backend(model.config.architectures)
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    llm = create_llm(path, "float32", max_model_len=64)
    del llm
    gc.collect()
    with torch.no_grad():
        assert torch.equal(load_hf(path, "float32")(ids).logits, before)


@pytest.mark.slow
def test_a_gpt2_style_context_is_read_as_transformers_reads_it(family_checkpoint):
    """gpt2 names its context ``n_positions``: read as ``max_position_embeddings`` (256 here), not
    missed and replaced by 4,096, which vLLM refuses with a ``ValidationError`` past the model's length."""
    from minirl.vllm.llm import create_llm, engine_settings

    llm = create_llm(family_checkpoint("gpt2"), "float32")
    assert engine_settings(llm)["max_model_len"] == 256
    del llm
    gc.collect()
