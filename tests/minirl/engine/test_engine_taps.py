"""Taps: every site of aligntools.sites, in execution order, flat over valid tokens."""

from __future__ import annotations

from collections import defaultdict

import torch

from aligntools.sites import all_sites
from minirl import Knobs, SamplingParams


class Recorder:
    def __init__(self) -> None:
        self.order: dict[int, list[str]] = defaultdict(list)  # step -> sites in call order
        self.values: dict[tuple[int, str], torch.Tensor] = {}
        self.meta: dict[tuple[int, str], object] = {}

    def __call__(self, site, value, meta) -> None:
        self.order[meta.step].append(site)
        self.values[meta.step, site] = value.clone()
        self.meta[meta.step, site] = meta


def test_every_site_in_order_in_prefill_and_each_decode_step(engine, prompts):
    eng = engine("tiny-qwen3-moe")
    rec = Recorder()
    eng.add_tap(rec)
    outs = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=3, seed=0, ignore_eos=True))
    expected = [s for s in all_sites(eng.n_layers, set(eng.moe_layers)) if s not in ("logprobs", "entropy")]
    assert sorted(rec.order) == [0, 1, 2, 3]  # prefill + one step per generated token
    for step, sites in rec.order.items():
        assert sites == expected, step
    n_prefill = 2 * sum(len(p) for p in prompts)
    h, e, k = eng.spec.hidden_size, eng.spec.n_experts, eng.spec.top_k
    shapes = {"embed": (n_prefill, h), "L1.q": (n_prefill, eng.spec.q_size), "L1.k": (n_prefill, eng.spec.kv_size),
              "L2.router_logits": (n_prefill, e), "L2.topk_ids": (n_prefill, k), "logits": (n_prefill, 512)}
    for site, shape in shapes.items():
        assert rec.values[0, site].shape == shape, site
    meta = rec.meta[0, "embed"]
    assert meta.request.tolist() == [r for r in range(6) for _ in range(len(prompts[r // 2]))]
    assert meta.position.tolist() == [i for r in range(6) for i in range(len(prompts[r // 2]))]
    for step in (1, 2, 3):  # decode emits only the fed token of each live sequence
        meta = rec.meta[step, "L0.resid_post"]
        assert meta.request.tolist() == list(range(6))
        assert meta.position.tolist() == [len(o.prompt_ids) + step - 1 for o in outs]
        assert meta.token_id.tolist() == [o.token_ids[step - 1] for o in outs]
        assert rec.values[step, "L0.resid_post"].shape == (6, h)


def test_residual_stream_is_emitted_unfused(engine, prompts):
    """With the fused add+norm kernel the engine never holds ``resid + delta`` outside the
    kernel; the taps still give the stream: resid_mid = resid_post(prev) + attn_out, bit for bit."""
    eng = engine("tiny-llama", "bfloat16")  # typical: fused_add
    rec = Recorder()
    eng.add_tap(rec)
    eng.score(prompts)
    v = lambda s: rec.values[0, s]  # noqa: E731
    prev = v("embed")
    for i in range(eng.n_layers):
        assert torch.equal(v(f"L{i}.resid_mid"), prev + v(f"L{i}.attn_out"))
        assert torch.equal(v(f"L{i}.resid_post"), v(f"L{i}.resid_mid") + v(f"L{i}.mlp_out"))
        prev = v(f"L{i}.resid_post")


def test_sites_equal_transformers_hidden_states(engine, hf_model, prompts):
    eng, hf = engine("tiny-qwen3", knobs=Knobs.aligned()), hf_model("tiny-qwen3")
    rec = Recorder()
    eng.add_tap(rec)
    eng.score(prompts[:1])
    with torch.no_grad():
        out = hf(torch.tensor(prompts[:1]), output_hidden_states=True)
    hs = [h[0] for h in out.hidden_states]  # n_layers + 1, the last one final-normed
    torch.testing.assert_close(rec.values[0, "embed"], hs[0], rtol=0, atol=1e-5)
    for i in range(eng.n_layers - 1):
        torch.testing.assert_close(rec.values[0, f"L{i}.resid_post"], hs[i + 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(rec.values[0, "final_norm"], hs[-1], rtol=0, atol=1e-5)
    torch.testing.assert_close(rec.values[0, "logits"], out.logits[0], rtol=0, atol=1e-5)


def test_taps_observe_without_changing_results(engine, prompts):
    eng = engine("tiny-mixtral", "bfloat16")
    params = SamplingParams(max_new_tokens=4, seed=1)
    plain = eng.generate(prompts, params)
    rec = Recorder()
    handle = eng.add_tap(rec)
    tapped = eng.generate(prompts, params)
    handle.remove()
    assert rec.order and all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(plain, tapped))
    rec.order.clear()
    eng.score(prompts)
    assert not rec.order  # removed taps are not called
