"""``weights=int4`` on a model whose expert width is not a multiple of 32: the weights that fit
are quantized, the rest stay in full precision and are named (engine, capture, ``mlab check``),
and ``fingerprint``, which tries int4 among its candidates, covers the model instead of dying."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

import aligntools
from aligntools.gates.inputs import prepare_tokens
from labs.cli import main
from minirl import Engine, Knobs, read_config
from minirl.engine.quantize import fake_quantize

EXPERT_WIDTH = 48  # not a multiple of int4's block of 32


@pytest.fixture(scope="module")
def moe48(zoo, tmp_path_factory):
    """tiny-qwen3-moe's config with 48-wide experts, random weights, the zoo model's tokenizer."""
    import transformers

    src = zoo("tiny-qwen3-moe")
    out = tmp_path_factory.mktemp("moe48")
    config = {**read_config(src), "moe_intermediate_size": EXPERT_WIDTH}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**config))
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def test_int4_quantizes_what_fits_and_names_the_rest(moe48, caplog):
    plain = Engine.from_pretrained(moe48, knobs=Knobs.aligned())
    with caplog.at_level(logging.WARNING, logger="minirl.engine.engine"):
        q = Engine.from_pretrained(moe48, knobs=Knobs.aligned().replace(weights="int4"))
    kept = q.unquantized
    assert kept and all(n.endswith(".experts_down") for n in kept)  # [E, hidden, 48]: 48 input features
    assert f"{EXPERT_WIDTH} input features, not a multiple of int4's block of 32" in kept["L0.experts_down"]
    assert "does not fit" in caplog.text and "L0.experts_down" in caplog.text
    for n, w in plain.model.w.items():
        if n in kept:
            assert torch.equal(q.model.w[n], w), n  # full precision
        elif n in ("L0.qkv", "L0.o", "L0.experts_gate_up"):
            assert torch.equal(q.model.w[n], fake_quantize(w, "int4", n)), n


def test_the_capture_and_mlab_check_list_the_unquantized_weights(moe48, capsys, tmp_path):
    engine = Engine.from_pretrained(moe48, knobs=Knobs.aligned().replace(weights="int4"))
    cap = aligntools.capture(engine, prepare_tokens(moe48, 24, n_seqs=1), progress=False)
    assert cap.unquantized == engine.unquantized
    report = tmp_path / "r.html"
    rc = main(["check", "--model", str(moe48), "--infer", "minirl:typical,weights=int4", "--tokens", "48",
               "--report", str(report)])
    assert rc in (0, 1)  # a verdict, not a crash
    assert "unquantized=L0.experts_down" in report.read_text()


def test_fingerprint_covers_a_model_int4_cannot_fully_hold(moe48):
    """Before: the int4 candidate raised and the whole search died."""
    target = Engine.from_pretrained(moe48, dtype="bfloat16", knobs=Knobs(weights="fp8_e4m3"))
    fp = aligntools.fingerprint(aligntools.capture(target, prepare_tokens(moe48, 24, n_seqs=1), progress=False),
                                moe48, passes=1)
    assert fp.knobs.weights == "fp8_e4m3"
