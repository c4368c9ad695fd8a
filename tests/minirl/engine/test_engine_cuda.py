"""The engine on a CUDA card (``make gpu-check``): aligned fp32 against transformers, graph
decode against eager decode, router replay records, taps and weight sync on the device.
Their CPU halves: test_engine_device.py and test_engine_graphs.py."""

from __future__ import annotations

import pytest
import torch

from minirl import Engine, Knobs, SamplingParams

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 means fp32: TF32 GEMMs would put transformers and the engine ~1e-3 apart."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _prompts(n: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 500, (int(torch.randint(4, 20, (), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-llama"])
def test_aligned_fp32_matches_transformers_on_cuda(name, zoo):
    import transformers

    path = zoo(name)
    eng = Engine.from_pretrained(path, dtype="float32", knobs=Knobs.aligned(), device="cuda")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").to(CUDA).eval()
    outs = eng.generate(_prompts(), SamplingParams(max_new_tokens=24, seed=0, ignore_eos=True))
    diffs = []
    with torch.no_grad():
        for o in outs:
            ids = torch.tensor([o.prompt_ids + o.token_ids], device=CUDA)
            ref = hf(ids).logits[0].float().log_softmax(-1)[:-1].gather(1, ids[0, 1:, None])[:, 0].cpu()
            diffs.append((o.logprobs - ref[len(o.prompt_ids) - 1:]).abs())
            diffs.append((eng.score([o.prompt_ids + o.token_ids])[0] - ref).abs())
    mean = torch.cat(diffs).mean().item()
    print(f"\n{name} aligned fp32 on CUDA: mean |dlogprob| vs transformers = {mean:.2e}")
    assert mean <= 1e-5


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-4), ("bfloat16", None)])
def test_graph_decode_equals_eager_decode(zoo, dtype, atol):
    """Same knobs, same seed: replayed graphs (rows padded to buckets, the whole cache read
    under a mask) sample what the eager steps sample. bf16: tokens may part after a near tie,
    so only the first token of each row is held equal there."""
    path = zoo("tiny-qwen3-moe")
    graphs = Engine.from_pretrained(path, dtype=dtype, device="cuda")
    eager = Engine.from_pretrained(path, dtype=dtype, device="cuda", cuda_graphs=False)
    assert graphs.decode_path.startswith("cuda graphs") and eager.decode_path == "eager: cuda_graphs=False"
    params = SamplingParams(n=2, max_new_tokens=40, seed=0, ignore_eos=True)
    g, e = graphs.generate(_prompts(), params), eager.generate(_prompts(), params)
    assert sorted(graphs.runner.graphs.graphs) == [1, 2, 4, 8, 16]
    for a, b in zip(g, e):
        if atol is None:
            assert a.token_ids[0] == b.token_ids[0]
            continue
        assert a.token_ids == b.token_ids
        assert torch.allclose(a.logprobs, b.logprobs, atol=atol, rtol=0)
        assert torch.equal(a.routed_experts, b.routed_experts)
    again = graphs.generate(_prompts(), params)  # graphs reused, cache reset
    assert [o.token_ids for o in again] == [o.token_ids for o in g]


def test_router_replay_records_and_taps_on_cuda(zoo):
    """Routing records come back on the host, one [n, n_moe, k] per rollout; a tap sees every
    value and its metadata on the engine's device, and its decode ``topk_ids`` are the records."""
    eng = Engine.from_pretrained(zoo("tiny-qwen3-moe"), device="cuda")
    devices: set[torch.device] = set()
    topk: dict[int, torch.Tensor] = {}
    layer = f"L{eng.moe_layers[0]}.topk_ids"

    def tap(site, value, meta):
        devices.update({value.device, meta.request.device, meta.position.device, meta.token_id.device})
        if site == layer and meta.step > 0:
            topk[meta.step] = value.cpu()

    handle = eng.add_tap(tap)
    assert eng.decode_path.startswith("eager: taps are attached")
    outs = eng.generate(_prompts(3), SamplingParams(max_new_tokens=5, seed=0, ignore_eos=True))
    handle.remove()
    assert devices == {CUDA}
    for step in range(1, 6):
        assert torch.equal(topk[step], torch.stack([o.routed_experts[step - 1, 0] for o in outs]))
    shape = (5, len(eng.moe_layers), eng.spec.top_k)
    assert all(o.routed_experts.device.type == "cpu" and o.routed_experts.shape == shape for o in outs)
    replay = Engine.from_pretrained(zoo("tiny-qwen3-moe"), device="cuda")  # graphs: the same records
    assert all(torch.equal(a.routed_experts, b.routed_experts) for a, b in
               zip(outs, replay.generate(_prompts(3), SamplingParams(max_new_tokens=5, seed=0, ignore_eos=True))))


def test_weight_sync_from_a_cuda_trainer(zoo):
    """A trainer model on the GPU syncs into a GPU engine in place (the graphs' addresses stay)
    and the engine then equals one loaded from that model's weights on the host."""
    import transformers

    path = zoo("tiny-qwen3")
    trainer = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(CUDA)
    with torch.no_grad():
        for p in trainer.parameters():
            p.mul_(1.01)
    eng = Engine.from_pretrained(path, device="cuda")
    params = SamplingParams(max_new_tokens=8, seed=0, ignore_eos=True)
    eng.generate(_prompts(), params)  # graphs captured on the old weights
    ptrs = {n: t.data_ptr() for n, t in eng.model.w.items()}
    eng.load_weights(trainer)
    assert {n: t.data_ptr() for n, t in eng.model.w.items()} == ptrs
    host = Engine(eng.config, {n: t.cpu() for n, t in trainer.state_dict().items()}, device="cuda")
    assert [o.token_ids for o in eng.generate(_prompts(), params)] == \
        [o.token_ids for o in host.generate(_prompts(), params)]
    assert eng.to("cpu").device.type == "cpu" and eng.generate(_prompts(2), params)


@pytest.mark.parametrize("knobs", [
    Knobs.typical_inference().replace(weights="fp8_e4m3"),
    Knobs.typical_inference().replace(weights="int4", attention="eager", rope="hf", rmsnorm="hf", topk="stable"),
    Knobs.typical_inference().replace(decode="recompute"),
    Knobs.typical_inference().replace(tp=2, share_prefill=True, kv_cache_dtype="float32", lm_head_dtype="float32"),
])
def test_every_knob_runs_on_cuda(zoo, knobs):
    """Quantized weights, both attention backends, the rope/norm/top-k variants, recompute
    decode, TP emulation and shared prefill all run on the card, graphs or not."""
    eng = Engine.from_pretrained(zoo("tiny-qwen3-moe"), dtype="bfloat16", knobs=knobs, device="cuda")
    outs = eng.generate(_prompts(4), SamplingParams(n=2, max_new_tokens=6, seed=0, ignore_eos=True))
    assert all(len(o.token_ids) == 6 and torch.isfinite(o.logprobs).all() for o in outs)
    assert all(t.device.type == "cuda" for t in eng.model.w.values())
