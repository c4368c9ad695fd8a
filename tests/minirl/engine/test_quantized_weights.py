"""``Knobs(weights=...)``: quantized rollout weights are applied at load and at every sync, move
the logprobs by format, and every tool that names knobs (engine specs, ``mlab check``,
``attribute``, ``fingerprint``) knows the knob."""

from __future__ import annotations

import pytest
import torch

import aligntools
from aligntools.gates.inputs import prepare_tokens
from labs.cli import main
from minirl import Engine, EngineSpec, Knobs, read_safetensors
from minirl.engine.quantize import fake_quantize

MOE = "tiny-qwen3-moe"
FP32 = Knobs.aligned()


def _quantized_names(engine: Engine) -> set[str]:
    return {n for n, t in engine.model.w.items() if n.startswith("L") and t.ndim >= 2 and not n.endswith(".router")}


def _check_engine_holds(quantized: Engine, plain: Engine, fmt: str) -> None:
    names = _quantized_names(plain)
    assert {"L0.qkv", "L0.o", "L0.experts_gate_up", "L0.experts_down"} <= names
    for n, w in plain.model.w.items():
        expect = fake_quantize(w, fmt, n) if n in names else w
        assert torch.equal(quantized.model.w[n], expect), n


def test_linear_weights_are_quantized_at_load_and_at_every_sync(engine, zoo):
    """embed, lm_head, router and norms stay exact; every layer matrix is quantized, also after
    ``load_weights`` (the RL weight sync) with new trainer weights."""
    q, plain = engine(MOE, "float32", FP32.replace(weights="int4")), engine(MOE, "float32", FP32)
    _check_engine_holds(q, plain, "int4")
    g = torch.Generator().manual_seed(1)
    moved = {n: t + 0.01 * torch.randn(t.shape, generator=g) for n, t in read_safetensors(zoo(MOE)).items()}
    q.load_weights(moved)
    plain.load_weights(moved)
    _check_engine_holds(q, plain, "int4")


def test_each_format_moves_the_logprobs_in_order_of_its_precision(engine):
    """vs the same fp32 engine unquantized: int8 (per-channel, 255 levels) < fp8 e4m3 (3 mantissa
    bits) < int4 (16 levels per block of 32)."""
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 500, (24,), generator=g).tolist() for _ in range(3)]
    base = torch.cat(engine(MOE, "float32", FP32).score(seqs))
    gap = {f: (torch.cat(engine(MOE, "float32", FP32.replace(weights=f)).score(seqs)) - base).abs().mean().item()
           for f in ("int8", "fp8_e4m3", "int4")}
    print(f"\nmean |Δ logprob| vs unquantized fp32: {gap}")
    assert 0 < gap["int8"] < gap["fp8_e4m3"] < gap["int4"] < 1.0


def test_unknown_format_names_the_valid_ones(zoo):
    with pytest.raises(ValueError, match=r"knob weights='int3'; valid: \['none', 'fp8_e4m3', 'int8', 'int4', 'fp8_e4m3_tensor'\]"):
        Engine.from_pretrained(zoo(MOE), knobs=Knobs(weights="int3"))
    with pytest.raises(TypeError, match="knob weights=4 must be str"):
        Knobs(weights=4)


def test_engine_spec_and_mlab_check_take_the_knob(zoo, capsys):
    spec = EngineSpec.parse("minirl:typical,weights=int4")
    assert (spec.preset, spec.options) == ("typical", {"weights": "int4"})
    assert spec.knobs() == Knobs(weights="int4")
    assert main(["check", "--model", str(zoo(MOE)), "--infer", "minirl:typical,weights=int4", "--tokens", "96"]) == 1
    verdict = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MISALIGNED")]
    assert verdict and "weights=int4" in verdict[0]


def test_attribute_puts_the_gap_of_a_quantized_engine_on_the_knob(zoo):
    att = aligntools.attribute(zoo(MOE), Knobs.aligned().replace(weights="int4", attention="sdpa"),
                               dtype="float32", tokens=96, progress=False)
    assert att.ranked == ["weights"]
    assert att.table.loc["weights", "infer"] == "int4" and att.table.loc["weights", "aligned"] == "none"
    assert att.table.loc["weights", "share"] > 0.99 and att.residual_gap < 1e-5 < att.baseline_gap


def test_fingerprint_finds_the_format_of_a_quantized_engine(zoo):
    path = zoo("tiny-llama")
    target = Engine.from_pretrained(path, dtype="bfloat16", knobs=Knobs(weights="fp8_e4m3"))
    fp = aligntools.fingerprint(aligntools.capture(target, prepare_tokens(path, 48, n_seqs=2), progress=False),
                                path, passes=1)
    assert fp.knobs.weights == "fp8_e4m3" and fp.distance == 0.0
