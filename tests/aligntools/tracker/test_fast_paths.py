"""The Tracker's fast paths give the values of the straightforward formulas, bit for bit.

Stats are reduced in the hook (min, max and the float64 sums in one compiled pass that replays
torch's summation order) and finished in one batch per flush, the derived sites run in
row blocks with torch's logsumexp steps written out, and tensor captures keep the engine's
dtype until written (and skip copies of what the adapter made): each is checked against the
formula it replaces, on every byte (NaN payloads included).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import aligntools
from aligntools.tracker import row_hash, stats
from aligntools.tracker.derived import NextTokenLogprobs, _sum_exp
from aligntools.tracker.recorder import CaptureBudgetExceeded, Recorder
from aligntools.tracker.store import MemoryStore
from aligntools.tracker.token_meta import TokenMeta


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a float tensor as integers: equality that also sees NaN payloads."""
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def awkward_rows() -> list[torch.Tensor]:
    """Rows of every kind stats mode meets: wide, narrow, several hash chunks, NaN/inf, ints, bf16."""
    g = torch.Generator().manual_seed(3)
    blown = torch.randn(37, 20, generator=g)
    blown[::3] = float("nan")
    blown[1::5, 2] = float("inf")
    return [torch.randn(64, 4096, generator=g), torch.randn(5, 3, 7, generator=g), blown,
            torch.randn(2, 40_000, generator=g) * 1e30, torch.randn(9, 300, generator=g).bfloat16(),
            torch.randint(0, 1 << 40, (9, 4), generator=g), torch.randint(0, 9, (6, 2), dtype=torch.int32),
            torch.randn(4, 0)]


def test_stats_finished_in_one_batch_equal_row_stats_of_each_tensor():
    xs = awkward_rows()
    batched = stats.finish_rows([stats.reduce_rows(x) for x in xs])
    for x, got in zip(xs, batched):
        assert torch.equal(bits(got), bits(stats.row_stats(x))), tuple(x.shape)


def test_logsumexp_written_out_is_torch_logsumexp():
    g = torch.Generator().manual_seed(7)
    for shape in [(1, 151_936), (7, 50_257), (33, 1000), (2, 40_000)]:
        x = torch.randn(*shape, generator=g) * 20
        if shape[0] > 2:
            x[0] = -float("inf")
            x[1, 3] = float("inf")
            x[2, 5] = float("nan")
        total, top = _sum_exp(x, torch.empty_like(x), torch.empty_like(x))
        got = total.log() + top
        assert torch.equal(bits(got), bits(torch.logsumexp(x, -1, keepdim=True))), shape


@pytest.mark.parametrize("n, vocab", [(6, 1001), (53, 40_000), (300, 8192), (1, 70_000)])
def test_logprobs_and_entropy_equal_the_plain_formula(n, vocab):
    """Also in row blocks, one of them one row longer (53 rows of 40000: 26 + 27): with two
    threads a lone 53rd row is summed in another order, which changes these bits."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, vocab, generator=g) * 4
    keys = [(0, p) for p in range(n)]
    token_of = {(0, p): (13 * p) % vocab for p in range(n)}
    lp, ent = NextTokenLogprobs().on_logits(torch.arange(n), keys, logits, token_of)
    top = logits.amax(-1, keepdim=True)
    shifted = logits - top
    e = torch.exp(shifted)
    log_s = e.sum(-1).log()
    want_ent = log_s - (e * shifted).sum(-1) / e.sum(-1)
    want_lp = torch.full((n,), float("nan"))
    for i, (r, p) in enumerate(keys):
        if (r, p + 1) in token_of:
            want_lp[i] = (logits[i, token_of[(r, p + 1)]] - top[i, 0]) - log_s[i]
    assert torch.equal(bits(ent), bits(want_ent)) and torch.equal(bits(lp), bits(want_lp))


@pytest.mark.parametrize("scale", [0.1, 4, 100])
def test_entropy_is_accurate_against_float64_also_for_peaked_rows(scale):
    """The one-exp-pass entropy sums p * (x - max): for peaked rows the textbook
    lse - sum(p * x) cancels two ~max terms (an error of eps * max, 5e-3 at scale 100)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 8192, generator=g) * scale
    keys = [(0, p) for p in range(40)]
    _, ent = NextTokenLogprobs(logprobs=False).on_logits(torch.arange(40), keys, logits, {})
    x = logits.double()
    want = -(torch.softmax(x, -1) * torch.log_softmax(x, -1)).sum(-1)
    assert (ent.double() - want).abs().max() < 8 * torch.finfo(torch.float32).eps * max(1.0, float(want.max()))


@pytest.mark.parametrize("offset", [0.0, 1e3, 1e5, 1e8])
def test_logprobs_are_accurate_against_float64_whatever_the_logits_offset(offset):
    """log p = (x[t] - max) - log(s): x[t] - logsumexp would cancel two terms of the size of
    the logits (an error of eps * offset: 3.9 at 1e8, found by a hostile review)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(20, 3000, generator=g) * 4 + offset
    keys = [(0, p) for p in range(20)]
    token_of = {(0, p): (17 * p) % 3000 for p in range(21)}
    lp, _ = NextTokenLogprobs(entropy=False).on_logits(torch.arange(20), keys, logits, token_of)
    want = torch.log_softmax(logits.double(), -1)[torch.arange(20), [token_of[(0, p + 1)] for p in range(20)]]
    assert (lp.double() - want).abs().max() < 8 * torch.finfo(torch.float32).eps * max(1.0, float(want.abs().max()))


def test_entropy_of_masked_vocab_rows_skips_the_masked_tokens():
    """-inf logits (a masked vocabulary: logit bias, structured output) have p = 0 and add
    nothing (0 log 0 = 0) instead of 0 * -inf = NaN; a NaN logit or an all-masked row has
    no distribution and stays NaN."""
    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(4)) * 3
    x[1, :500] = -float("inf")
    x[2, 7] = float("nan")
    x[3] = -float("inf")
    x[4, :999] = -float("inf")  # one token left: H = 0
    _, ent = NextTokenLogprobs(logprobs=False).on_logits(torch.arange(6), [(0, p) for p in range(6)], x, {})
    p, logp = torch.softmax(x.double(), -1), torch.log_softmax(x.double(), -1)
    want = -torch.where(p > 0, p * logp, 0.0).sum(-1)
    ok = [0, 1, 4, 5]
    torch.testing.assert_close(ent[ok].double(), want[ok], rtol=0, atol=1e-5)
    assert ent[2].isnan() and ent[3].isnan()


def test_bf16_tensor_capture_is_widened_when_written(zoo, ids):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(zoo("tiny-llama"), dtype=torch.bfloat16).eval()
    seen = {}
    model.model.layers[0].register_forward_hook(lambda m, a, out: seen.setdefault("v", out))
    got = aligntools.capture(model, ids, "L0.resid_post", progress=False).dataset["L0.resid_post"].values
    want = seen["v"].float().reshape(-1, got.shape[1]).numpy()
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()


def test_budget_counts_the_stored_float32_bytes_of_a_bf16_value():
    meta = TokenMeta(torch.zeros(4, dtype=torch.long), torch.arange(4), torch.arange(4), 0)
    value = torch.ones(4, 8, dtype=torch.bfloat16)  # 64 bytes now, 128 once stored as float32
    for budget, fits in ((128, True), (127, False)):
        rec = Recorder(["embed"], "tensor", MemoryStore({}), budget_bytes=budget, flush_bytes=None, progress=False)
        with pytest.raises(CaptureBudgetExceeded, match="to 128 bytes") if not fits else contextlib.nullcontext():
            rec.emit("embed", value, meta)


def test_repeated_token_in_one_emit_gets_one_row():
    meta = TokenMeta(torch.tensor([0, 0, 1]), torch.tensor([5, 5, 0]), torch.tensor([9, 9, 4]), 0)
    rec = Recorder(["embed"], "tensor", MemoryStore({}), flush_bytes=None, progress=False)
    rec.emit("embed", torch.arange(6.0).reshape(3, 2), meta)
    rec.finish({}, complete=True)
    ds = rec.dataset()
    assert ds["position"].values.tolist() == [5, 0] and ds["token_id"].values.tolist() == [9, 4]


def test_tensor_mode_copies_what_the_engine_may_still_hold_and_keeps_what_it_was_given():
    meta = TokenMeta(torch.zeros(3, dtype=torch.long), torch.arange(3), torch.arange(3), 0)
    rec = Recorder(["embed", "final_norm"], "tensor", MemoryStore({}), flush_bytes=None, progress=False)
    engine_value, made_for_us = torch.randn(3, 4), torch.randn(3, 4)
    rec.emit("embed", engine_value, meta)
    rec.emit("final_norm", made_for_us, meta, owned=True)
    engine_value.zero_()  # the engine reuses its buffer after the hook
    rec.finish({}, complete=True)
    ds = rec.dataset()
    assert ds["embed"].values.any() and ds["final_norm"].values.tobytes() == made_for_us.numpy().tobytes()


@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_dataset_assembled_directly_is_the_public_constructors(hf_model, ids, mode):
    import xarray as xr

    ds = aligntools.capture(hf_model("tiny-qwen3-moe"), ids, mode=mode, progress=False).dataset
    public = xr.Dataset({n: ds.variables[n] for n in ds.data_vars}, coords={n: ds.variables[n] for n in ds.coords},
                        attrs=ds.attrs)
    assert ds.identical(public) and list(ds.variables) == list(public.variables)
    assert set(ds.xindexes) == set(public.xindexes) == ({"stat"} if mode == "stats" else set())
    assert "emitted.logits" in ds.coords and ds.sel(token=slice(1, 3)).sizes["token"] == 2


@pytest.mark.parametrize("mode", ["tensor", "stats"])
def test_editing_a_captures_attrs_does_not_reach_the_next_capture(hf_model, ids, mode):
    """Site layouts are cached across captures: what a user edits on one capture stays there."""
    model = hf_model("tiny-llama")
    first = aligntools.capture(model, ids, mode=mode, progress=False).dataset
    first["L0.q"].attrs["dtype"] = "edited"
    first["logprobs"].attrs.pop("derived_from")
    again = aligntools.capture(model, ids, mode=mode, progress=False).dataset
    assert again["L0.q"].attrs == {"dtype": "float32"}
    assert again["logprobs"].attrs == {"dtype": "float32", "derived_from": "logits"}


def kernel_rows() -> list[torch.Tensor]:
    """float32 rows around every lane, ILP, cascade-step and level boundary of torch's sums,
    with a 1e-30..1e30 spread of magnitudes (so any change of order changes the bits)."""
    g = torch.Generator().manual_seed(11)
    widths = [*range(1, 80), 255, 256, 257, 1023, 1024, 1025, 4096 + 17, 16 * 16 * 16 + 5, 32767]
    widths += torch.randint(1, 32768, (40,), generator=g).tolist()
    return [torch.randn(n, d, generator=g) * torch.exp(torch.randn(n, d, generator=g) * 7)
            for i, d in enumerate(widths) for n in ((1, 2, 5, 9)[i % 4],)]


def test_compiled_row_kernel_is_torch_bit_for_bit():
    from aligntools.tracker import compiled_row_stats

    if not stats._kernel_agrees():
        pytest.skip("this torch build sums in another order: stats mode uses torch's path")
    for x in kernel_rows() + [torch.randn(600, 37), torch.randn(2, 32767) * 1e30]:
        got, flags = compiled_row_stats.row_sums(x, row_hash.keys(x.shape[1]))
        want = (x.amin(1).double(), x.amax(1).double(), *stats._sum_l2(x))
        for name, a, b in zip(("min", "max", "sum", "l2"), got, want):
            assert torch.equal(bits(a), bits(b)), (name, tuple(x.shape))
        assert flags == 0, tuple(x.shape)  # no zero min/max, no NaN/inf in these rows


def test_compiled_row_kernel_flags_zero_extremes_and_nonfinite_rows():
    from aligntools.tracker import compiled_row_stats

    x = torch.randn(4, 37) + 10  # all positive: no zero extreme
    assert compiled_row_stats.row_sums(x, row_hash.keys(x.shape[1]))[1] == 0
    x[1, 5] = -0.0  # now the min of row 1 is a zero
    assert compiled_row_stats.row_sums(x, row_hash.keys(x.shape[1]))[1] == compiled_row_stats.ZERO_MIN_MAX
    x[2, 0] = float("nan")
    assert compiled_row_stats.row_sums(x, row_hash.keys(x.shape[1]))[1] == compiled_row_stats.ZERO_MIN_MAX | compiled_row_stats.NONFINITE_SUM
    x[1, 5] = 1.0
    x[2, 0] = float("-inf")
    assert compiled_row_stats.row_sums(x, row_hash.keys(x.shape[1]))[1] == compiled_row_stats.NONFINITE_SUM


def test_stats_with_and_without_the_compiled_kernel_are_the_same_bytes(monkeypatch):
    signed_zeros = torch.randn(6, 40)
    signed_zeros[0] = signed_zeros[0].abs()
    signed_zeros[0, 3] = -0.0  # min is -0.0 or 0.0 depending on the order: torch's is kept
    signed_zeros[1] = -signed_zeros[1].abs()
    signed_zeros[1, 7] = 0.0
    xs = awkward_rows() + kernel_rows()[::7] + [signed_zeros, torch.zeros(3, 16), -torch.zeros(3, 16)]
    monkeypatch.setattr(stats, "COMPILED_MIN", 1)  # every size through the compiled kernels, then none
    monkeypatch.setattr(row_hash, "COMPILED_MIN", 1)
    fast = [stats.row_stats(x) for x in xs]
    monkeypatch.setattr(stats, "_compiled_applies", lambda flt: False)
    monkeypatch.setattr(row_hash, "COMPILED_MIN", 1 << 62)
    for x, got in zip(xs, fast):
        assert torch.equal(bits(got), bits(stats.row_stats(x))), tuple(x.shape)


def test_a_tiny_models_stats_never_load_numba():
    """Below ``COMPILED_MIN`` elements stats take torch's path: the ~1.3 s numba costs a process
    (import, on-disk cache) is not paid for a tiny model, e.g. by an RL run's mismatch monitor."""
    import subprocess
    import sys

    code = ("import sys, torch, aligntools; from aligntools.tracker.stats import row_stats; "
            "row_stats(torch.randn(64, 64)); row_stats(torch.randint(0, 8, (64, 2))); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numba' or m.endswith('compiled_row_stats'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert stats._compiled_applies(torch.randn(4, row_hash.COMPILED_MIN // 4)) == stats._kernel_agrees()
