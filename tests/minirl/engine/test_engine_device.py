"""Device plumbing on CPU: what ``device=`` accepts and refuses, where the engine's tensors
live, why decode runs eagerly, and in-place weight sync (the addresses CUDA graphs hold).
The same on a card: tests/minirl/engine/test_engine_cuda.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minirl import Engine, Knobs, SamplingParams
from minirl.engine.ops import resolve_device
from minirl.engine.runner import ModelRunner


@pytest.mark.parametrize("device, error, message", [
    ("meta", ValueError, r"device='meta' holds no data"),
    ("gpu0", ValueError, r"device='gpu0' is not a torch device; use 'cpu', 'cuda' or 'cuda:N'"),
    ("mps", ValueError, r"device='mps': the minirl engine runs on 'cpu' or 'cuda'"),
    (0, TypeError, r"device must be a str or torch.device such as 'cpu' or 'cuda'; got int"),
])
def test_bad_devices_are_refused_before_the_weights_are_read(zoo, device, error, message):
    with pytest.raises(error, match=message):
        Engine.from_pretrained(zoo("tiny-llama"), device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_says_so(zoo):
    with pytest.raises(ValueError, match=r"device='cuda' but torch.cuda.is_available\(\) is False"):
        Engine.from_pretrained(zoo("tiny-llama"), device="cuda")


def test_explicit_cpu_puts_every_tensor_on_cpu(zoo, prompts):
    eng = Engine.from_pretrained(zoo("tiny-qwen3-moe"), device=torch.device("cpu"))
    assert eng.device == torch.device("cpu") == resolve_device("cpu")
    assert {t.device for t in eng.model.w.values()} == {torch.device("cpu")}
    assert all(t.device == torch.device("cpu") for t in eng.model.rope_tables.values())
    seen: set[torch.device] = set()
    eng.add_tap(lambda site, value, meta: seen.update({value.device, meta.request.device, meta.position.device,
                                                       meta.token_id.device}))
    out = eng.generate(prompts, SamplingParams(max_new_tokens=3, seed=0, ignore_eos=True))
    assert seen == {torch.device("cpu")}
    assert out[0].logprobs.device == out[0].routed_experts.device == torch.device("cpu")
    assert eng.to("cpu") is eng


@pytest.mark.parametrize("knobs, taps, graphs, reason", [
    (Knobs.typical_inference(), [], True, None),
    (Knobs.typical_inference(), [], False, "cuda_graphs=False"),
    (Knobs.typical_inference().replace(decode="recompute"), [], True, "decode='recompute' keeps no KV cache"),
    (Knobs.aligned(), [], True, "batch_invariant runs each row alone"),
    (Knobs.typical_inference(), [print], True, "taps are attached"),
])
def test_why_decode_runs_eagerly_on_cuda(knobs, taps, graphs, reason):
    """The reasons a CUDA engine decodes without graphs (no GPU needed to ask)."""
    runner = ModelRunner(SimpleNamespace(device=torch.device("cuda", 0)), knobs, taps, graphs)
    got = runner.eager_reason()
    assert got is None if reason is None else got.startswith(reason)


def test_weight_sync_copies_in_place(zoo, prompts):
    """``load_weights`` keeps every tensor's address (a captured graph reads them) and accepts
    tensors of another dtype; the synced engine equals a freshly loaded one."""
    from minirl.engine.checkpoint import read_safetensors

    path = zoo("tiny-qwen3")
    eng = Engine.from_pretrained(path)
    ptrs = {n: t.data_ptr() for n, t in eng.model.w.items()}
    sd = {n: (t * 1.01).to(torch.bfloat16) for n, t in read_safetensors(path).items()}
    eng.load_weights(sd)
    assert {n: t.data_ptr() for n, t in eng.model.w.items()} == ptrs
    fresh = Engine(eng.config, sd, device="cpu")
    params = SamplingParams(max_new_tokens=4, seed=0, ignore_eos=True)
    synced, loaded = eng.generate(prompts, params), fresh.generate(prompts, params)
    assert [o.token_ids for o in synced] == [o.token_ids for o in loaded]
