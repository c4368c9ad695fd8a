"""``Knobs(activations="fp8")``: every quantized linear layer's input goes through vLLM's
per-token fp8 quantizer (router, lm_head and embeddings do not), per rank under TP, and every
tool that takes an engine spec (``mlab check``, TrainConfig's ``engine:``) takes the knob."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minirl.engine.model as model_module
from labs.cli import main
from minirl import EngineSpec, Knobs, SamplingParams
from minirl.engine.ops import row_parallel_linear
from minirl.engine.quantize import fake_quantize_activations
from minirl.engines import build_engine
from minirl.training.train_config import TrainConfig

FP32 = Knobs.aligned()
W8A8 = "minirl:weights=fp8_e4m3_tensor,activations=fp8"


def _spy(monkeypatch) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Record the quantizer's outputs and every F.linear call's (input, weight)."""
    quantized: list[torch.Tensor] = []
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    real_quant, real_linear = model_module.fake_quantize_activations, F.linear

    def quant(x, fmt):
        quantized.append(real_quant(x, fmt))
        return quantized[-1]

    def linear(x, w, bias=None):
        calls.append((x, w))
        return real_linear(x, w, bias)

    monkeypatch.setattr(model_module, "fake_quantize_activations", quant)
    monkeypatch.setattr(F, "linear", linear)
    return quantized, calls


def test_every_dense_layer_gemm_reads_a_quantized_input_and_nothing_else_does(engine, monkeypatch):
    eng = engine("tiny-qwen3", "float32", FP32.replace(activations="fp8"))
    layer_weights = {t.data_ptr(): n for n, t in eng.model.w.items() if n.startswith("L") and t.ndim == 2}
    quantized, calls = _spy(monkeypatch)
    eng.score([[5, 17, 99, 3, 42, 7]])
    outputs = {id(q) for q in quantized}
    by_weight = [(layer_weights.get(w.data_ptr()), id(x) in outputs) for x, w in calls]  # row-parallel: a view
    layer_calls = [(n, q) for n, q in by_weight if n is not None]
    assert {n.split(".")[1] for n, _ in layer_calls} == {"qkv", "o", "gate_up", "down"}
    assert all(q for _, q in layer_calls), [n for n, q in layer_calls if not q]
    assert not any(q for n, q in by_weight if n is None)  # lm_head's input is not quantized
    assert len(quantized) == 4 * eng.model.spec.n_layers


def test_moe_experts_read_quantized_inputs_and_the_router_does_not(engine, monkeypatch):
    eng = engine("tiny-qwen3-moe", "float32", FP32.replace(activations="fp8"))
    routers = {id(t) for n, t in eng.model.w.items() if n.endswith(".router")}
    quantized, calls = _spy(monkeypatch)
    eng.score([[5, 17, 99, 3, 42, 7]])
    outputs = {id(q) for q in quantized}
    router_inputs = [x for x, w in calls if id(w) in routers]
    assert len(router_inputs) == eng.model.spec.n_layers and not any(id(x) in outputs for x in router_inputs)
    assert len(quantized) == 4 * eng.model.spec.n_layers  # qkv, o, experts' gate_up and down inputs


def test_activation_quantization_moves_the_logprobs_beyond_the_weights_alone(engine):
    """W8A8 (FlashRL-style online fp8) vs W8 alone vs the unquantized fp32 engine."""
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 500, (24,), generator=g).tolist() for _ in range(3)]
    base = torch.cat(engine("tiny-qwen3", "float32", FP32).score(seqs))

    def gap(**knobs) -> float:
        return (torch.cat(engine("tiny-qwen3", "float32", FP32.replace(**knobs)).score(seqs)) - base).abs().mean().item()

    weights_only, both = gap(weights="fp8_e4m3_tensor"), gap(weights="fp8_e4m3_tensor", activations="fp8")
    print(f"\nmean |Δ logprob| vs fp32: W8 {weights_only:.3g}, W8A8 {both:.3g}")
    assert 0 < weights_only < both


def test_row_parallel_ranks_quantize_their_own_slice():
    """Under TP each rank's per-token scale comes from its slice of the features."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 64, generator=g), torch.randn(8, 64, generator=g)
    x[:, 40] = 50.0  # an outlier in rank 1's slice only: rank 0's scale must not see it

    def quant(t):
        return fake_quantize_activations(t, "fp8")

    expect = F.linear(quant(x[:, :32]), w[:, :32]) + F.linear(quant(x[:, 32:]), w[:, 32:])
    assert torch.equal(row_parallel_linear(x, w, None, 2, quant), expect)
    assert not torch.equal(row_parallel_linear(x, w, None, 2, quant), F.linear(quant(x), w))


def test_an_architecture_with_its_own_attention_refuses_rather_than_half_applies(zoo):
    from minirl import Engine

    with pytest.raises(ValueError, match=r"activations='fp8' is implemented for the llama/qwen layer layout, "
                                         r"not BailingTransformer"):
        Engine.from_pretrained(zoo("tiny-ring-linear"), knobs=Knobs(activations="fp8"))


def test_unknown_activation_format_names_the_valid_ones(zoo):
    from minirl import Engine

    with pytest.raises(ValueError, match=r"knob activations='int8'; valid: \['none', 'fp8'\]"):
        Engine.from_pretrained(zoo("tiny-llama"), knobs=Knobs(activations="int8"))


def test_engine_spec_mlab_check_and_train_config_take_the_knob(zoo, capsys):
    assert EngineSpec.parse(W8A8).knobs() == Knobs(weights="fp8_e4m3_tensor", activations="fp8")
    path = zoo("tiny-llama")
    assert main(["check", "--model", str(path), "--infer", "minirl:weights=fp8_e4m3,activations=fp8",
                 "--tokens", "64"]) == 1
    out = capsys.readouterr().out
    verdict = [line for line in out.splitlines() if line.startswith("MISALIGNED")]
    assert verdict and "activations=fp8" in verdict[0], out
    assert TrainConfig(engine=W8A8).engine == W8A8  # validated on construction
    eng = build_engine(W8A8, path, "float32", rollouts=True)  # what the trainer builds from ``engine:``
    assert eng.knobs.activations == "fp8" and eng.model.act_quant is not None
    rollout = eng.generate([[5, 17, 99]], SamplingParams(max_new_tokens=6, ignore_eos=True, seed=0))[0]
    seq = [rollout.prompt_ids + rollout.token_ids]
    quantized_prefill = eng.score(seq)[0][-6:]
    weights_only = build_engine("minirl:weights=fp8_e4m3_tensor", path, "float32").score(seq)[0][-6:]
    decode_err = (rollout.logprobs - quantized_prefill).abs().max()  # decode (KV cache) quantizes as prefill does
    assert (quantized_prefill - weights_only).abs().max() > 10 * decode_err


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe", "tiny-mixtral", "tiny-ring-linear"])
def test_fingerprint_skips_activations_exactly_where_the_engine_refuses_them(zoo, name):
    from aligntools.replayer.fingerprint import OWN_ATTENTION
    from minirl import read_config
    from minirl.engine import archs

    config = read_config(zoo(name))
    assert archs.resolve(config)[1].model.quantizes_activations() == (config["model_type"] not in OWN_ATTENTION)


def test_fingerprint_finds_a_w8a8_engine(zoo):
    """A FlashRL-style engine (per-tensor fp8 weights, per-token fp8 inputs) is told apart from
    per-channel fp8 and from weight-only fp8: the search lands on it at distance 0."""
    import aligntools
    from aligntools.gates.inputs import prepare_tokens
    from minirl import Engine

    path = zoo("tiny-llama")
    target = Engine.from_pretrained(path, dtype="bfloat16", knobs=EngineSpec.parse(W8A8).knobs())
    fp = aligntools.fingerprint(aligntools.capture(target, prepare_tokens(path, 48, n_seqs=2), progress=False),
                                path, passes=1)
    assert (fp.knobs.weights, fp.knobs.activations, fp.distance) == ("fp8_e4m3_tensor", "fp8", 0.0)
