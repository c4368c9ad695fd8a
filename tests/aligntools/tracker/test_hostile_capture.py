"""Bad inputs a hostile review threw at the Tracker, each kept as a test.

Each one used to end silently wrong (wrong rows kept, a stale patch left behind, a journal
wiped) or with a bare error; now each raises or warns naming the problem and the fix, and
nothing an earlier run wrote is lost.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import aligntools
from aligntools.tracker.capture_dataset import Capture
from aligntools.tracker.journal import partial_path
from aligntools.tracker.stats import row_stats


@pytest.fixture
def llama(hf_model) -> torch.nn.Module:
    return hf_model("tiny-llama")


def _interrupted_journal(model: torch.nn.Module, out) -> int:
    """An earlier run at ``out`` that died after its first call: its journal's row count."""
    with pytest.raises(RuntimeError, match="died"):
        with aligntools.Tracker(model, sites="logits", out=out, flush_bytes=1), torch.no_grad():
            model(torch.tensor([[5, 6, 7]]))
            raise RuntimeError("died")
    with pytest.warns(UserWarning, match="partial"):
        return Capture.load(partial_path(out)).dataset.sizes["token"]


@pytest.mark.parametrize("bad", [{"on_budget": "Stats"}, {"input_ids": "negative"}, {"input_ids": "too big"}])
def test_a_bad_option_or_id_keeps_the_journal_of_an_earlier_interrupted_run(llama, tmp_path, bad):
    out = tmp_path / "cap.zarr"
    before = _interrupted_journal(llama, out)
    ids = torch.tensor([[5, 6, 7]])
    if bad.get("input_ids") == "negative":
        ids, bad = ids - 10, {}
    elif bad.get("input_ids") == "too big":
        ids, bad = ids + llama.config.vocab_size, {}
    with pytest.raises(ValueError, match="on_budget must be|input_ids must lie in"):
        aligntools.capture(llama, ids, sites="logits", out=out, **bad)
    with pytest.warns(UserWarning, match="partial"):
        assert Capture.load(partial_path(out)).dataset.sizes["token"] == before == 3


def test_input_ids_on_the_meta_device_are_refused_by_name(llama):
    """Before: torch's "Tensor.item() cannot be called on meta tensors" from the range check."""
    with pytest.raises(ValueError, match="meta device, which holds shapes but no values"):
        aligntools.capture(llama, torch.empty(2, 8, dtype=torch.long, device="meta"), sites="logits")


def test_token_ids_of_any_integer_dtype_are_captured_alike(llama, ids):
    want = aligntools.capture(llama, ids, sites="logits")["logits"].values
    for dtype in (torch.uint8, torch.int16, torch.int32):
        assert np.array_equal(aligntools.capture(llama, ids.to(dtype), sites="logits")["logits"].values, want)


@pytest.mark.parametrize("answer", [
    lambda meta: torch.tensor([0, 1]),  # indices, not a mask
    lambda meta: meta.position,  # ints
    lambda meta: (meta.position >= 2).float(),  # a float mask
    lambda meta: (meta.position >= 2)[:-1],  # one short
    lambda meta: torch.ones(100, dtype=torch.bool),  # too long
    lambda meta: True,
    lambda meta: None,
])
def test_a_token_filter_must_answer_a_bool_mask_of_one_entry_per_token(llama, ids, answer):
    with pytest.raises(ValueError, match=r"token_filter must return a bool tensor of shape \[14\]"):
        aligntools.capture(llama, ids, sites="logits", token_filter=answer)


def test_a_capture_that_holds_no_token_says_why(llama, ids):
    with pytest.warns(UserWarning, match="token_filter kept none"):
        cap = aligntools.capture(llama, ids, sites="logits", token_filter=lambda meta: meta.position > 100)
    assert cap.dataset.sizes.get("token", 0) == 0
    with pytest.warns(UserWarning, match="no forward of the tracked model ran"):
        with aligntools.Tracker(llama, sites="embed"), torch.no_grad():
            llama.model(input_ids=ids)  # the backbone, which the Tracker does not hook as a call


@pytest.mark.parametrize("kwargs, message", [
    ({"sites": 3}, "sites must be glob patterns"),
    ({"sites": ["logits", 3]}, "sites must be glob patterns"),
    ({"progress": "x"}, "progress must be True, False or None"),
])
def test_wrong_option_types_are_refused_by_name(llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        aligntools.Tracker(llama, **kwargs)


def test_trackers_exiting_out_of_order_leave_no_rope_patch_behind(hf_model, zoo, ids):
    import transformers
    import transformers.models.llama.modeling_llama as modeling

    original = modeling.apply_rotary_pos_emb
    a = hf_model("tiny-llama")
    b = transformers.AutoModelForCausalLM.from_pretrained(zoo("tiny-llama"), dtype=torch.float32).eval()
    first, second = aligntools.Tracker(a, sites="L0.q"), aligntools.Tracker(b, sites="L0.k")
    first.__enter__()
    second.__enter__()
    with torch.no_grad():
        a(input_ids=ids)
        b(input_ids=ids)
    first.__exit__(None, None, None)  # not the last one in: its wrapper is under the second's
    with torch.no_grad():
        b(input_ids=ids)  # the second still captures through both wrappers
    second.__exit__(None, None, None)
    assert modeling.apply_rotary_pos_emb is original
    assert first.capture.dataset.sizes["token"] == 14 and second.capture.dataset.sizes["token"] == 28


def test_stats_of_strided_rows_equal_those_of_the_same_values_stored_contiguous():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 120, generator=g) * torch.exp(torch.randn(30, 120, generator=g) * 3)
    column_major = x.t().contiguous().t()
    assert torch.equal(row_stats(column_major).view(torch.int64), row_stats(x).view(torch.int64))


class _WritesThroughData(torch.nn.Module):
    """A user's module (not library code) that writes its input through ``.data`` after use,
    a write torch's version counter does not see."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        x.data.mul_(2)
        return out


def test_models_with_non_library_modules_are_copied_not_borrowed(zoo, ids):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(zoo("tiny-llama"), dtype=torch.float32).eval()
    model.model.layers[0].mlp = _WritesThroughData(model.model.layers[0].mlp)
    truth = aligntools.capture(model, ids, sites="L0.mlp_norm", copy=True)["L0.mlp_norm"].values
    assert np.array_equal(aligntools.capture(model, ids, sites="L0.mlp_norm")["L0.mlp_norm"].values, truth)


def test_a_failed_finish_is_what_the_capture_property_reports(llama, ids):
    tracker = aligntools.Tracker(llama, sites="logits")
    with pytest.raises(aligntools.tracker.borrowed.CapturedValueModified, match="code inside the `with` block"):
        with tracker, torch.no_grad():
            llama(input_ids=ids).logits.div_(0.7)  # a sampling loop's temperature, in place
    with pytest.raises(RuntimeError, match="no capture: finishing it failed with CapturedValueModified"):
        tracker.capture
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and copy=True captures the same loop without a word
        with aligntools.Tracker(llama, sites="logits", copy=True) as ok, torch.no_grad():
            llama(input_ids=ids).logits.div_(0.7)
    assert ok.capture.dataset.sizes["token"] == 14


def test_beam_search_is_noticed_and_noted_on_the_capture(llama, ids):
    """Beam search reorders rows between steps, so the derived logprobs pair logits with
    another hypothesis's token: the capture says so (warning + ``notes`` attr)."""
    with pytest.warns(UserWarning, match="beam search reordered the batch rows"):
        with aligntools.Tracker(llama) as beams, torch.no_grad():
            llama.generate(ids, num_beams=3, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert "beam search" in beams.capture.dataset.attrs["notes"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with aligntools.Tracker(llama) as greedy, torch.no_grad():
            llama.generate(ids, num_beams=1, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert "notes" not in greedy.capture.dataset.attrs
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # without logprobs there is nothing to warn about
        with aligntools.Tracker(llama, sites="logits"), torch.no_grad():
            llama.generate(ids, num_beams=3, max_new_tokens=4, do_sample=False, pad_token_id=0)


def test_logprobs_of_an_output_narrower_than_the_ids_say_so():
    """A raw module's output is its ``logits`` site; when it is not vocab-wide, a next-token
    id falls outside it: a clear error naming the fix, not torch's bare index error."""
    narrow = torch.nn.Sequential(torch.nn.Embedding(130, 8), torch.nn.Linear(8, 8))
    ids = torch.tensor([[3, 117, 5]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # raw module paths
        with pytest.raises(ValueError, match="next-token id 117 is outside the 8 logits"):
            aligntools.capture(narrow, ids, progress=False)
        cap = aligntools.capture(narrow, ids, sites="logits,0,1", progress=False)
    assert cap.sites == ["logits", "0", "1"] and cap.complete


def test_a_decode_token_outside_the_logits_say_so():
    """The same during decode, where the next token arrives a step after its row's logits."""
    from aligntools.tracker.derived import NextTokenLogprobs

    derive = NextTokenLogprobs()
    derive.on_logits(torch.tensor([0]), [(0, 4)], torch.randn(1, 8), token_of={})  # next token not known yet
    with pytest.raises(ValueError, match="next-token id 9 is outside the 8 logits"):
        derive.on_token((0, 5), 9)
