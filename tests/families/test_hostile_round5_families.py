"""Hostile inputs, round 5: the family table's readers (``minirl.families``) and the readers of
the logits transform (the trainer's ``head_logprobs``, the HF capture's ``logits`` site, the gate).

Rule (docs/models.md, "Config values"): every scale, soft-cap and size is read as the model reads
it or refused naming its key; never taken for 1 (a scale of 0 made the trainer and the capture
disagree with the model's own forward). Ids as in the round-5 case list."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from minirl import families as fam
from minirl.families import FamilyConfigError, embed_scale, expert_count, family, has_entry, logits_transform
from tests.families.tiny import COMMON

BAD_SCALES = {"zero": 0.0, "negative": -0.0625, "nan": math.nan, "inf": math.inf, "subnormal": 1e-320,
              "string": "0.5", "bool": True}


@pytest.mark.parametrize("value", BAD_SCALES.values(), ids=BAD_SCALES.keys())
@pytest.mark.parametrize("case,model_type,key", [("FM01-FM06", "cohere", "logit_scale"),
                                                 ("FM07-FM10", "granite", "logits_scaling"),
                                                 ("FM11-FM15", "gemma2", "final_logit_softcapping")])
def test_FM01_FM15_a_logits_scale_or_cap_off_its_domain_is_refused_by_key(case, model_type, key, value):
    with pytest.raises(FamilyConfigError, match=rf"^{model_type}: {key} = .* in the config.*Fix {key} in config.json"):
        logits_transform(SimpleNamespace(model_type=model_type, **{key: value}))


@pytest.mark.parametrize("value", [math.nan, 0.0, -1.0, "12", True], ids=["nan", "zero", "neg", "str", "bool"])
def test_FM16_FM20_granite_embedding_multiplier_off_its_domain_is_refused(value):
    with pytest.raises(FamilyConfigError, match="granite: embedding_multiplier = "):
        embed_scale(SimpleNamespace(model_type="granite", embedding_multiplier=value))


@pytest.mark.parametrize("config", [{"hidden_size": 0}, {"hidden_size": -64}, {}], ids=["FM21", "FM22", "FM23"])
def test_FM21_FM23_gemma_hidden_size_must_be_a_positive_int(config):
    with pytest.raises(FamilyConfigError, match="gemma: hidden_size = .*positive int"):
        embed_scale(SimpleNamespace(model_type="gemma", **config))


def test_FM24_a_multimodal_gemma3_config_is_read_through_its_text_config():
    from transformers import Gemma3Config

    config = Gemma3Config()
    assert not hasattr(config, "hidden_size") or config.hidden_size == config.text_config.hidden_size
    assert embed_scale(config) == math.sqrt(config.text_config.hidden_size)
    assert logits_transform(config).softcap == config.text_config.final_logit_softcapping


@pytest.mark.parametrize("value", [["llama"], 7], ids=["FM25-list", "FM27-int"])
def test_FM25_FM27_a_model_type_that_is_not_a_string_is_refused(value):
    with pytest.raises(FamilyConfigError, match="model_type = .* must be a string"):
        family(SimpleNamespace(model_type=value))


def test_FM26_a_miscased_model_type_has_no_entry_and_is_left_to_the_invariants():
    config = SimpleNamespace(model_type="Gemma2")
    assert family(config) is fam.DEFAULT and not has_entry(config)


def test_FM28_FM29_expert_counts_are_positive_ints_in_key_order():
    assert expert_count({"num_experts": 8.0}) is None and expert_count({"num_local_experts": True}) is None
    assert expert_count({"num_experts": 0, "n_routed_experts": 4}) == 4


def _tiny(model_type: str, **overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**COMMON, **overrides})
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _trainer_vs_model(model) -> float:
    from minirl.training.trainer_forward import trainer_logprobs

    ids = torch.randint(3, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits.double(), -1)[:, :-1].gather(2, ids[:, 1:, None])[..., 0]
    return float((torch.stack(trainer_logprobs(model, ids.tolist())).double() - ref).abs().max())


@pytest.mark.parametrize("case,model_type,overrides", [
    ("HL01", "cohere", {"logit_scale": 0.0625}), ("HL05", "granite", {"logits_scaling": 8.0}),
    ("HL08", "gemma2", {"final_logit_softcapping": 30.0}), ("HL11", "gemma3_text", {"final_logit_softcapping": None}),
    ("HL12", "granite", {"embedding_multiplier": 0.0})])
def test_HL01_HL12_the_trainers_head_gives_the_models_log_probs(case, model_type, overrides):
    """Bound: fp32 log-softmax over a 512 vocab, chunked vs whole: ~1e-6; 1e-5 leaves room."""
    assert _trainer_vs_model(_tiny(model_type, **overrides)) <= 1e-5


@pytest.mark.parametrize("case,model_type,key,value", [
    ("HL02", "cohere", "logit_scale", 0.0), ("HL06", "granite", "logits_scaling", 0.0),
    ("HL03", "cohere", "logit_scale", -0.0625), ("HL04", "cohere", "logit_scale", math.nan),
    ("HL07", "granite", "logits_scaling", -8.0), ("HL09", "gemma2", "final_logit_softcapping", 0.0),
    ("HL10", "gemma2", "final_logit_softcapping", -30.0)])
def test_HL02_HL10_the_trainer_refuses_a_bad_scale_naming_its_key(case, model_type, key, value):
    with pytest.raises(FamilyConfigError, match=rf"{model_type}: {key} = "):
        _trainer_vs_model(_tiny(model_type, **{key: value}))


@pytest.mark.parametrize("case,model_type,key,value", [
    ("CP01", "cohere", "logit_scale", 0.0), ("CP02", "granite", "logits_scaling", 0.0),
    ("CP03", "gemma2", "final_logit_softcapping", 0.0), ("CP04", "granite", "embedding_multiplier", math.nan)])
def test_CP01_CP04_the_capture_refuses_what_the_trainer_refuses(case, model_type, key, value):
    from aligntools.tracker.tracker import capture

    with pytest.raises(FamilyConfigError, match=rf"{model_type}: {key} = "):
        capture(_tiny(model_type, **{key: value}), torch.randint(3, 500, (1, 6)), progress=False)


def test_CP05_a_plain_cohere_logits_site_is_what_the_model_softmaxes():
    from aligntools.tracker.tracker import capture

    model, ids = _tiny("cohere", logit_scale=0.0625), torch.randint(3, 500, (1, 8))
    with torch.no_grad():
        want = model(ids).logits[0]
    got = torch.from_numpy(capture(model, ids, progress=False)["logits"].values)
    assert torch.allclose(got, want, rtol=0, atol=1e-6 * float(want.abs().max()))


def test_FG01_mlab_check_refuses_a_gemma2_soft_cap_of_0_by_name(tmp_path, zoo, capsys):
    """The gate and the trainer read the config one way: a model the trainer refuses gets no verdict."""
    import shutil

    from labs.cli import main

    model = _tiny("gemma2", final_logit_softcapping=0.0, tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "m")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(zoo("tiny-qwen3") / f, tmp_path / "m" / f)
    assert main(["check", "--model", str(tmp_path / "m"), "--tokens", "16", "--infer", "minirl:aligned"]) == 2
    assert "gemma2: final_logit_softcapping = 0.0 in the config" in capsys.readouterr().err


def _saved(tmp_path, zoo, model_type: str, tokenizer: bool = True, **overrides):
    import shutil

    out = tmp_path / model_type
    _tiny(model_type, **overrides).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json") if tokenizer else ():
        shutil.copy(zoo("tiny-qwen3") / f, out / f)
    return out


def test_FG02_a_plain_gemma3_text_model_is_gated(tmp_path, zoo, capsys):
    from labs.cli import main

    path = _saved(tmp_path, zoo, "gemma3_text", final_logit_softcapping=None)
    assert main(["check", "--model", str(path), "--tokens", "16", "--infer", "minirl:aligned"]) == 0
    assert "family gemma3_text (entry, on transformers): invariants hold" in capsys.readouterr().out


def test_FG03_granite_on_minirl_is_refused_by_name(tmp_path, zoo, capsys):
    from labs.cli import main

    path = _saved(tmp_path, zoo, "granite", logits_scaling=8.0)
    assert main(["check", "--model", str(path), "--tokens", "16", "--infer", "minirl:aligned"]) == 2
    assert "granite" in capsys.readouterr().err


def test_FG04_a_string_tie_word_embeddings_is_refused_by_key(tmp_path, zoo, capsys):
    import json

    from labs.cli import main

    path = _saved(tmp_path, zoo, "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": "false"}))
    assert main(["check", "--model", str(path), "--tokens", "16", "--infer", "minirl:aligned"]) == 2
    assert "tie_word_embeddings" in capsys.readouterr().err


def test_FG05_a_checkpoint_without_tokenizer_files_is_refused_naming_them(tmp_path, zoo, capsys):
    from labs.cli import main

    path = _saved(tmp_path, zoo, "llama", tokenizer=False)
    assert main(["check", "--model", str(path), "--tokens", "16", "--infer", "minirl:aligned"]) == 2
    assert "tokenizer" in capsys.readouterr().err
