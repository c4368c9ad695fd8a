"""``engine:`` in a run's config is checked by ``TrainConfig`` itself (``minirl.engines.resolve``),
so ``mlab train`` refuses a bad one with exit 2 before the SFT warm-up or any model load: before,
a typo surfaced in ``Trainer.__init__``, minutes later."""

from __future__ import annotations

import pytest
import yaml

from labs import cli


class Loaded(BaseException):
    """Raised by every loader: a BaseException, so ``mlab``'s error handling cannot turn it into exit 2."""


@pytest.fixture
def no_loads(monkeypatch):
    import transformers

    from minirl.engine.engine import Engine
    from minirl.training import trainer

    def refuse(*args, **kwargs):
        raise Loaded("a model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(Engine, "from_pretrained", refuse)
    monkeypatch.setattr(trainer, "warm_start", refuse)


@pytest.mark.parametrize("sets, message", [
    (["engine=vlm"], "engine: engine spec 'vlm': unknown engine 'vlm'; engines here: minirl, vllm"),
    (["engine=minirl:bogus=1"], "unknown knob 'bogus'; valid knobs: rmsnorm"),
    (["engine=hf"], "a hf engine cannot generate rollouts; use one of minirl, vllm"),
    (["engine=minirl:float32", "engine_dtype=bfloat16"], "names dtype float32 but the dtype given is bfloat16"),
])
def test_a_bad_engine_exits_2_before_any_model_loads(sets, message, no_loads, zoo, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": str(zoo("tiny-llama")), "sft_steps": 100,
                                      "out_dir": str(tmp_path / "out")}))
    argv = ["train", "--config", str(config)] + [arg for s in sets for arg in ("--set", s)]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_fixture_catches_a_load(no_loads, zoo, tmp_path):
    """The test above could pass by a load failing quietly: a good engine reaches the loaders."""
    import minirl

    with pytest.raises(Loaded):
        minirl.train({"model": str(zoo("tiny-llama")), "out_dir": str(tmp_path / "out"), "progress": False})
