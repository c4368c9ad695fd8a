"""PrepackedLinear: a bf16 GEMM's product on CPU bf16 weights, by whichever path this CPU's choice
takes: ``packed`` (oneDNN's native bf16 kernel on a weight packed once: F.linear's bits; it runs
only where ``prepack.available()``) or ``emulated`` (fp32 GEMMs on the bf16 operands: runs
anywhere). Each path this box can run is tested here; the choice itself is tested by forcing it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minirl import Engine, SamplingParams
from minirl.engine import prepack
from minirl.engine.prepack import PrepackedLinear

# [O, K]: smollm2-135m's qkv / o / gate_up / down, gemma3-270m's, the zoo's tiny ones, and odd sizes
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (1536, 640), (640, 1024), (4096, 640), (640, 2048),
          (192, 64), (64, 64), (256, 64), (64, 128), (8192, 96), (100, 37), (1, 7)]
ROWS = [1, 2, 3, 7, 16, 31, 32, 33, 64, 100, 300, 1000]
PARAMS = SamplingParams(n=2, max_new_tokens=6, seed=8, ignore_eos=True)
PATHS = ["emulated"] + (["packed"] if prepack.available() else [])
"""The paths the code may take on this box: the packed one needs oneDNN's bf16 GEMM, so elsewhere
it is not a test case (not a skip: there is nothing of it to run)."""


@pytest.fixture
def force(monkeypatch):
    """``force(path)``: make PrepackedLinear take ``path`` (``packed``, ``emulated`` or ``plain``:
    native bf16 without packing, i.e. ``F.linear``)."""
    def set_path(path: str) -> None:
        monkeypatch.setenv(prepack.ENV, "emulated" if path == "emulated" else "native")
        if path == "plain":
            monkeypatch.setattr(prepack, "available", lambda: False)

    return set_path


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


BF16_U = 2.0 ** -8
"""bf16's unit roundoff (8 significant bits): a round-to-nearest moves v by at most half an ulp,
which is between 2^-9 |v| and 2^-8 |v| depending on where v sits in its binade."""


def assert_a_bf16_gemm(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what,
                        native: torch.Tensor | None = None) -> None:
    """``y`` is the exact product (float64) after an fp32 accumulation, rounded once to bf16:
    |y - ref| <= 2^-8 (|ref| + acc) + acc, where acc = (K + 1) 2^-24 sum |x| |w| (+ |bias|) bounds the
    fp32 accumulation (the bf16 x bf16 products are exact in fp32) and 2^-8 |v| half a bf16 ulp at v.
    ``native``, another bf16 GEMM of the same operands, differs from it by summation order only:
    their fp32 sums lie within 2 acc, and each rounding adds at most half an ulp."""
    ref = F.linear(x.double(), w.double(), None if bias is None else bias.double())  # [N, O]
    terms = F.linear(x.float().abs(), w.float().abs(), None if bias is None else bias.float().abs())
    acc = (x.shape[-1] + 1) * 2.0 ** -24 * terms.double()  # [N, O]
    assert y.dtype == torch.bfloat16
    assert bool(((y.double() - ref).abs() <= BF16_U * (ref.abs() + acc) + acc).all()), what
    if native is not None:
        top = torch.maximum(y.double().abs(), native.double().abs())
        assert bool(((y.double() - native.double()).abs() <= 2 * BF16_U * (top + acc) + 2 * acc).all()), what


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("o,k", SHAPES)
def test_the_product_is_a_bf16_gemm(path, o, k, force):
    """Every path against float64 (the bound of one fp32-accumulated GEMM rounded once), against
    torch's native bf16 ``F.linear`` (which runs on any CPU, slowly without native bf16): up to
    summation order; the packed one is F.linear's bits."""
    force(path)
    linear, w, bias = PrepackedLinear(), _bf16(o, k, seed=o), _bf16(o, seed=k)
    for n in ROWS:
        x = _bf16(n, k, seed=n)
        for b in (None, bias):
            y, native = linear(x, w, b), F.linear(x, w, b)
            assert_a_bf16_gemm(y, x, w, b, (o, k, n, b is None), native)
            if path == "packed":
                assert torch.equal(y, native), (o, k, n, b is None)
    kept = linear._packed if path == "packed" else linear._fp32
    assert len(kept) == 1  # one copy of the weight, reused by every row count


@pytest.mark.parametrize("path", PATHS)
def test_an_in_place_write_refreshes_and_clear_drops_every_copy(path, force):
    force(path)
    linear, w, x = PrepackedLinear(), _bf16(256, 64, seed=0), _bf16(8, 64, seed=1)
    before = linear(x, w)
    w.mul_(1.5)  # a notebook's perturbation: the version counter moves
    after = linear(x, w)
    assert_a_bf16_gemm(after, x, w, None, "after the write")
    assert not torch.equal(after, before)
    linear.clear()
    assert len(linear._packed) == len(linear._fp32) == 0


@pytest.mark.parametrize("path", PATHS)
def test_what_it_does_not_speed_up_is_plain_f_linear(path, force):
    force(path)
    linear = PrepackedLinear()
    w32, x32 = torch.randn(64, 32), torch.randn(4, 32)
    w_grad = _bf16(64, 32, seed=0).requires_grad_()
    x = _bf16(4, 32, seed=2)
    assert torch.equal(linear(x32, w32), F.linear(x32, w32))
    out = linear(x, w_grad)
    assert out.requires_grad and torch.equal(out, F.linear(x, w_grad))  # autograd keeps F.linear
    assert len(linear._packed) == len(linear._fp32) == 0


@pytest.mark.parametrize("path", PATHS)
def test_a_tensor_parallel_slice_is_computed_and_not_kept(path, force):
    """A slice is a fresh view each call: computed on its path (packed: F.linear), nothing kept."""
    force(path)
    linear, x = PrepackedLinear(), _bf16(4, 32, seed=2)
    view = _bf16(64, 64, seed=1)[:, :32]
    y = linear(x, view)
    assert_a_bf16_gemm(y, x, view, None, "slice")
    if path == "packed":
        assert torch.equal(y, F.linear(x, view))
    assert len(linear._packed) == len(linear._fp32) == 0


@pytest.mark.parametrize("native", [True, False])
def test_the_path_choice(native, monkeypatch):
    """auto: packed where oneDNN runs bf16, emulated elsewhere; the variable forces either way;
    forced native without oneDNN's bf16 is torch's own kernel, F.linear's bits."""
    monkeypatch.setattr(prepack, "available", lambda: native)
    monkeypatch.delenv(prepack.ENV, raising=False)
    assert prepack.emulates() is (not native)
    for choice, emulated in (("auto", not native), ("native", False), ("emulated", True)):
        monkeypatch.setenv(prepack.ENV, choice)
        assert prepack.emulates() is emulated, choice
    monkeypatch.setenv(prepack.ENV, "fast")
    with pytest.raises(ValueError, match="MINIRL_BF16_GEMM='fast': expected one of auto, native, emulated"):
        prepack.emulates()
    if not native:
        monkeypatch.setenv(prepack.ENV, "native")
        linear, w, x = PrepackedLinear(), _bf16(64, 32, seed=0), _bf16(4, 32, seed=1)
        assert torch.equal(linear(x, w), F.linear(x, w)) and len(linear._packed) == len(linear._fp32) == 0


def test_the_path_is_announced_once(monkeypatch, caplog):
    monkeypatch.setenv(prepack.ENV, "emulated")
    prepack._announce.cache_clear()
    with caplog.at_level("WARNING", logger=prepack.__name__):
        for _ in range(3):
            prepack.emulates()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "bf16 GEMMs: emulated as fp32 GEMMs on bf16 operands"]
    assert torch.backends.cpu.get_cpu_capability() in caplog.records[0].getMessage()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-moe"])
def test_a_bf16_engine_on_each_path_and_after_a_weight_sync(path, name, zoo, prompts, monkeypatch, force):
    """A bf16 engine's rollouts and scores on ``path`` against the plain native one (``F.linear``):
    packed, the same bits; emulated, the same tokens and logprobs within bf16's own noise (below
    the bf16 engine's distance to the fp32 one). After ``load_weights`` (an in-place copy) each
    decodes with the new weights, not stale copies."""
    import transformers

    force(path)
    eng = Engine.from_pretrained(zoo(name), dtype=torch.bfloat16)
    mine = eng.generate(prompts, PARAMS)
    assert len(eng.model.linear._packed if path == "packed" else eng.model.linear._fp32) > 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(zoo(name), dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(1.02)  # stands in for the model after an RL step
    eng.load_weights(hf)
    synced, synced_scores = eng.generate(prompts, PARAMS), eng.score(prompts)
    force("plain")
    plain = Engine.from_pretrained(zoo(name), dtype=torch.bfloat16)
    before = plain.generate(prompts, PARAMS)
    plain.load_weights(hf)
    plain_synced, plain_scores = plain.generate(prompts, PARAMS), plain.score(prompts)
    assert not _same(synced, mine)
    if path == "packed":
        assert _same(before, mine) and _same(plain_synced, synced)
        assert all(torch.equal(a, b) for a, b in zip(plain_scores, synced_scores))
        return
    fp32 = Engine.from_pretrained(zoo(name), dtype=torch.float32)
    gap, noise = _decode_gap(mine, before, fp32)
    fp32.load_weights(hf)
    gap_synced, noise_synced = _decode_gap(synced, plain_synced, fp32)
    gap, noise = torch.cat([gap, gap_synced]), torch.cat([noise, noise_synced])
    assert float(gap.mean()) <= float(noise.mean()), (float(gap.mean()), float(noise.mean()))
    gap = torch.cat([(a - b).abs() for a, b in zip(synced_scores, plain_scores)])
    noise = torch.cat([(a - b).abs() for a, b in zip(plain_scores, fp32.score(prompts))])
    assert float(gap.mean()) <= float(noise.mean()), (float(gap.mean()), float(noise.mean()))


def _decode_gap(emulated: list, native: list, fp32: Engine) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token both decodes sampled (up to a row's first differing token): |emulated - native|
    logprob, and bf16's own noise there, |native - fp32| (the fp32 engine scoring the same tokens)."""
    gaps, noises = [], []
    for e, n in zip(emulated, native, strict=True):
        same = next((i for i, (a, b) in enumerate(zip(e.token_ids, n.token_ids)) if a != b), len(n.token_ids))
        truth = fp32.score([list(n.prompt_ids) + list(n.token_ids)])[0][len(n.prompt_ids) - 1:]  # [new tokens]
        gaps.append((e.logprobs[:same] - n.logprobs[:same]).abs())
        noises.append((n.logprobs[:same] - truth[:same]).abs())
    assert sum(len(g) for g in gaps) >= len(native) * len(native[0].token_ids) // 2  # mostly the same tokens
    return torch.cat(gaps), torch.cat(noises)


def _same(a, b) -> bool:
    return all(x.token_ids == y.token_ids and torch.equal(x.logprobs, y.logprobs) for x, y in zip(a, b))
