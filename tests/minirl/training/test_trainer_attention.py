"""``trainer_attention: auto`` (the default) loads every family: eager where transformers refuses
sdpa (Gemma 2, gpt-oss exited 2 with the old ``sdpa`` default), sdpa elsewhere; the run's saved
config names the kernel it resolved to, and a resume compares kernels, not the word ``auto``."""

from __future__ import annotations

import pytest
import yaml

from minirl.training import attention, resume
from tests.families.conftest import family_checkpoint  # noqa: F401 (a fixture: the tiny family checkpoints)


@pytest.mark.parametrize("model_type,kernel", [("gemma2", "eager"), ("gpt_oss", "eager"), ("llama", "sdpa"),
                                               ("qwen3_moe", "sdpa")])
def test_auto_picks_sdpa_only_where_the_model_class_supports_it(model_type, kernel, family_checkpoint):
    path = family_checkpoint(model_type)
    assert attention.resolve("auto", path) == kernel
    assert attention.resolve("sdpa", path) == "sdpa" and attention.resolve("eager", path) == "eager"


def test_a_default_run_of_a_family_without_sdpa_trains_and_names_its_kernel(quick_config, family_checkpoint):
    from minirl.driver import train
    from minirl.training.trainer import Trainer

    config = quick_config(model=str(family_checkpoint("gemma2")), sft_steps=0, steps=1, checkpoint_every=1)
    assert config.trainer_attention == "auto"
    result = train(config)
    assert len(result.rows) == 1 and result.model.config._attn_implementation == "eager"
    saved = yaml.safe_load((result.out_dir / "config.yaml").read_text())
    assert saved["trainer_attention"] == "eager"
    assert Trainer(config).cfg.trainer_attention == "eager"  # used directly, the trainer resolves it too
    more = quick_config(model=config.model, sft_steps=0, steps=2, checkpoint_every=1)
    resume.check_before_loading(more)  # auto resolves to the saved eager: no change
    resume.check_before_loading(quick_config(model=config.model, sft_steps=0, steps=2, trainer_attention="eager"))
    with pytest.raises(ValueError, match=r"--resume would change trainer_attention .*'eager' -> 'sdpa'"):
        resume.check_before_loading(quick_config(model=config.model, sft_steps=0, steps=2, trainer_attention="sdpa"))


def test_explicit_sdpa_is_kept_and_refused_by_transformers_by_name(quick_config, family_checkpoint):
    """``sdpa`` asked for by name is not silently swapped for eager: transformers' refusal says why."""
    from minirl.training.trainer import Trainer

    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        Trainer(quick_config(model=str(family_checkpoint("gpt_oss")), sft_steps=0, trainer_attention="sdpa"))
