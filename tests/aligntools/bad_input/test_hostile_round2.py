"""Values the second hostile pass (issue 26) got through silently or with a message that did not
say what is wrong: each is now refused by name before anything heavy runs (or, for GPT-2 in
``mlab capture``, gives the result the API gives)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import aligntools
from aligntools.gates.inputs import GateUsageError
from minirl import EngineSpec, Knobs

IDS = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])


def test_a_token_filter_that_returns_a_string_is_named(llama_model):
    """Before: torch's "new(): invalid data type 'str'"."""
    with pytest.raises(ValueError, match=r"token_filter must return a bool tensor of shape \[8\].*got str 'all'"):
        aligntools.capture(llama_model, IDS, sites="logits", token_filter=lambda meta: "all")


@pytest.mark.parametrize("tokens, match", [
    (IDS.float() + 0.7, r"tokens: token ids must be an integer tensor; got torch.float32"),
    (IDS.bool(), r"tokens: token ids must be an integer tensor; got torch.bool"),
    (256.5, r"tokens must be a count of built-in text tokens .*; got float 256.5"),
    ([[5, 6]], r"tokens must be a count .*; got list"),
])
def test_check_alignment_refuses_token_ids_that_are_not_integers(llama, tokens, match):
    """Before: float ids were truncated (5.7 -> 5) and another text was gated."""
    with pytest.raises(GateUsageError, match=match):
        aligntools.check_alignment(llama, tokens=tokens, progress=False)


@pytest.mark.parametrize("spec, key", [
    ("minirl:typical,tp=2,tp=4", "tp"),
    ("minirl,rmsnorm=hf, rmsnorm =fused_add", "rmsnorm"),
    ("hf:float32,attn=eager,attn=sdpa", "attn"),
    ("vllm:bfloat16,seed=1,seed=2", "seed"),
])
def test_an_engine_spec_that_repeats_an_option_is_refused_by_name(spec, key):
    """Before: the last value won without a word (``tp=2,tp=4`` ran tp=4)."""
    with pytest.raises(ValueError, match=rf"engine spec '{spec}' sets option '{key}' more than once"):
        EngineSpec.parse(spec)
    with pytest.raises(ValueError, match=rf"sets option '{key}' more than once \({key}=\w+,{key}=\w+\)"):
        EngineSpec.parse(spec)


def test_mlab_refuses_a_repeated_knob_with_exit_2(llama, tmp_path, mlab):
    code, _, err = mlab("capture", "--model", llama, "--engine", "minirl:typical,tp=2,tp=4", "--text", "hi",
                        "--out", tmp_path / "c.nc")
    assert code == 2 and "sets option 'tp' more than once (tp=2,tp=4)" in err, err


def test_a_spec_without_repeats_still_parses():
    assert EngineSpec.parse("minirl:aligned, tp=2 ,rmsnorm=hf").knobs() == Knobs.aligned().replace(tp=2, rmsnorm="hf")


@pytest.fixture(scope="module")
def llama_capture(llama_model) -> aligntools.Capture:
    return aligntools.capture(llama_model, IDS, sites="L0.resid_post,logits", progress=False)


@pytest.mark.parametrize("passes", [0, -1, 1.5, True])
def test_fingerprint_refuses_a_search_without_passes(llama_capture, llama, passes):
    """Before: ``passes=-1`` ran no search and reported the typical preset as the fingerprint."""
    with pytest.raises(ValueError, match=rf"passes={passes!r}: must be an integer >= 1"):
        aligntools.fingerprint(llama_capture, llama, passes=passes)


def test_fingerprint_refuses_a_capture_with_nan_rows_or_inf(llama_capture, llama):
    """Before: "distance 0, no remaining divergence" (the error metrics dropped the NaNs)."""
    ds = llama_capture.dataset.copy(deep=True)
    ds["L0.resid_post"].values[[1, 2]] = np.nan
    with pytest.raises(ValueError, match=r"site L0.resid_post holds NaN or inf in 2 token row\(s\), the first at "
                                         r"request 0 position 1"):
        aligntools.fingerprint(ds, llama, passes=1)
    ds = llama_capture.dataset.copy(deep=True)
    ds["logits"].values[5, 3] = np.inf
    with pytest.raises(ValueError, match=r"site logits holds NaN or inf in 1 token row\(s\), the first at "
                                         r"request 1 position 1"):
        aligntools.fingerprint(ds, llama, passes=1)


def test_fingerprint_refuses_another_checkpoints_capture(llama_capture, llama, tmp_path):
    from safetensors.torch import load_file, save_file

    other = shutil.copytree(llama, tmp_path / "other")
    weights = load_file(other / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"taken from another model \(model_hash \w{12}\) than .*other.*"
                                         r"allow_different_models=True"):
        aligntools.fingerprint(llama_capture, other, passes=1)


def test_fingerprint_refuses_a_capture_of_another_shape(llama):
    """An in-memory model has a parameter hash, not a file hash: its shape tells it apart."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=64, num_hidden_layers=6,
                                   num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    cap = aligntools.capture(model, IDS, sites="L5.resid_post,logits", progress=False)
    with pytest.raises(ValueError, match=r"does not fit .*: it has a site of layer 5, the checkpoint's "
                                         r"num_hidden_layers is 4"):
        aligntools.fingerprint(cap, llama, passes=1)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"infer_knobs": {"rmsnorm": "hf"}}, TypeError, r"infer_knobs=\{'rmsnorm': 'hf'\}: must be a minirl Knobs"),
    ({"infer_knobs": "typcial"}, ValueError, r"infer_knobs='typcial': .* one of aligned, typical, hf_exact"),
    ({"target": 3}, TypeError, r"target=3: must be a minirl Knobs"),
    ({"knobs": "rmsnorm"}, TypeError, r"knobs must be a list of knob names such as \['rmsnorm', 'rope'\]"),
])
def test_attribute_refuses_knobs_of_the_wrong_kind_before_loading(llama, kwargs, error, match, monkeypatch):
    from aligntools.gates import inputs

    monkeypatch.setattr(inputs, "load_hf", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(error, match=match):
        aligntools.attribute(llama, tokens=16, progress=False, **kwargs)


def test_attribute_takes_a_preset_name_as_engine_specs_do(llama):
    """``infer_knobs="typical"`` means ``Knobs.typical_inference()`` (before: AttributeError
    "'str' object has no attribute 'to_dict'" after the trainer's forward)."""
    a = aligntools.attribute(llama, infer_knobs="typical", target="hf_exact", knobs=["rmsnorm"], dtype="float32",
                             tokens=16, progress=False)
    assert a.table.loc["rmsnorm", "infer"] == str(Knobs.typical_inference().rmsnorm)
    assert a.table.loc["rmsnorm", "aligned"] == str(Knobs.hf_exact().rmsnorm)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny random GPT-2: an architecture without the Llama-style names (n_embd, n_layer ...)."""
    import transformers

    cfg = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2")
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


def test_mlab_captures_a_gpt2_checkpoint_at_raw_module_paths(gpt2, tmp_path, mlab):
    """Before: "unreadable checkpoint: config.json has no integer 'hidden_size'" (GPT-2 says n_embd)."""
    (tmp_path / "ids.json").write_text("[[1, 2, 3], [4, 5, 6]]")
    with pytest.warns(UserWarning, match="capturing raw module paths instead of sites"):
        code, out, err = mlab("capture", "--model", gpt2, "--ids", tmp_path / "ids.json", "--out", tmp_path / "c.nc")
    assert code == 0, err
    cap = aligntools.Capture.load(tmp_path / "c.nc")
    assert cap.dataset.sizes["token"] == 6 and "transformer.h.1" in cap.dataset.data_vars


def test_mlab_checks_gpt2_ids_against_its_n_positions(gpt2, tmp_path, mlab):
    (tmp_path / "ids.json").write_text(str([list(range(40))]))
    code, _, err = mlab("capture", "--model", gpt2, "--ids", tmp_path / "ids.json", "--out", tmp_path / "c.nc")
    assert code == 2 and "over the model's max_position_embeddings 32" in err, err


def test_hf_float64_is_a_dtype_like_the_help_says():
    """``--help`` calls the part after ``hf:`` a DTYPE and ``--dtype float64`` worked, yet
    ``hf:float64`` was refused as an unknown preset."""
    assert EngineSpec.parse("hf:float64").dtype == "float64"
    with pytest.raises(ValueError, match=r"'float8' is not a hf dtype \(float32, bfloat16, float16, float64\)"):
        EngineSpec.parse("hf:float8")
