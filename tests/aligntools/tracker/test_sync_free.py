"""A capture on a device reads nothing on the host inside the forward, and syncs once after it.

The device path is forced on CPU tensors (``pending.on_device`` answers True), so the code a
CUDA run takes is checked on any machine: every Tensor method and torch function that reads a
value on the host (or, on a device, waits for it) is counted while the forward runs, when
called from aligntools' own code.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import aligntools
from aligntools.tracker import pending

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "nonzero", "masked_select")
TORCH_READS = ("nonzero", "masked_select", "argwhere")


class SyncCounter:
    """Counts host reads made from aligntools code while ``inside`` is set, and the syncs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inside, self.reads, self.syncs = False, [], 0
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), name))
        for name in TORCH_READS:
            monkeypatch.setattr(torch, name, self._counted(getattr(torch, name), f"torch.{name}"))
        to = torch.Tensor.to

        def counted_to(t, *args, **kwargs):  # a blocking copy to the host
            target = next((a for a in args if isinstance(a, (str, torch.device))), kwargs.get("device"))
            if target is not None and torch.device(target).type == "cpu" and not kwargs.get("non_blocking"):
                self._note(".to(cpu)")
            return to(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", counted_to)
        monkeypatch.setattr(torch.cuda, "synchronize", self._counted(torch.cuda.synchronize, "cuda.synchronize"))
        sync = pending.synchronize

        def counted_sync(device):
            self.syncs += 1
            self._note("pending.synchronize")
            return sync(device)

        monkeypatch.setattr(pending, "synchronize", counted_sync)
        monkeypatch.setattr(pending, "on_device", lambda t: True)  # the path a CUDA run takes

    def _counted(self, fn, name):
        def wrapper(*args, **kwargs):
            self._note(name)
            return fn(*args, **kwargs)
        return wrapper

    def _note(self, name: str) -> None:
        if not self.inside:
            return
        frame = sys._getframe(2)
        while frame is not None and _skipped(frame.f_globals.get("__name__", "")):
            frame = frame.f_back  # torch's own wrappers: the caller is the first frame outside torch
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        if module.startswith("aligntools"):
            self.reads.append(f"{name} from {module}:{frame.f_lineno}")

    @contextmanager
    def window(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False


def _hook_window(model: torch.nn.Module, counter: SyncCounter) -> list:
    """The root module's forward: its first pre-hook to its first forward hook (registered before
    the Tracker's, so the Tracker's layout setup is inside and its end-of-forward sync outside)."""
    def start(*_):
        counter.inside = True

    def stop(*_):
        counter.inside = False

    return [model.register_forward_pre_hook(start), model.register_forward_hook(stop)]


@pytest.mark.parametrize("mode", ["stats", "tensor"])
def test_hf_forward_reads_nothing_on_the_host(monkeypatch, hf_model, ids, mode):
    model = hf_model("tiny-llama")
    want = aligntools.capture(model, ids, mode=mode, progress=False)  # the CPU path
    counter = SyncCounter(monkeypatch)
    handles = _hook_window(model, counter)
    try:
        got = aligntools.capture(model, ids, mode=mode, progress=False)
    finally:
        for h in handles:
            h.remove()
    assert (counter.reads, counter.syncs) == ([], 1)
    _assert_same_capture(got, want)


@pytest.mark.parametrize("mode", ["stats", "tensor"])
def test_minirl_forward_reads_nothing_on_the_host(monkeypatch, zoo, ids, mode):
    from minirl import Engine, Knobs

    eng = Engine.from_pretrained(zoo("tiny-llama"), knobs=Knobs.aligned())
    want = aligntools.capture(eng, ids, mode=mode, progress=False)
    counter = SyncCounter(monkeypatch)
    forward = eng.model.forward

    def windowed(*args, **kwargs):
        with counter.window():
            return forward(*args, **kwargs)

    monkeypatch.setattr(eng.model, "forward", windowed, raising=False)
    got = aligntools.capture(eng, ids, mode=mode, progress=False)
    assert (counter.reads, counter.syncs) == ([], 1)
    _assert_same_capture(got, want)


def test_padding_and_token_filter_are_applied_after_the_forward(monkeypatch, hf_model):
    """Left padding and a token filter: the device path keeps every row until the host reads
    which are real, then keeps the same rows as the CPU path, derived logprobs included."""
    model = hf_model("tiny-llama")
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])

    def run(mode):
        with aligntools.Tracker(model, mode=mode, progress=False, token_filter=lambda m: m.position >= 1) as t:
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask, use_cache=False)
        return t.capture

    want = {mode: run(mode) for mode in ("stats", "tensor")}
    counter = SyncCounter(monkeypatch)
    for mode in ("stats", "tensor"):
        got = run(mode)
        assert got.dataset.sizes["token"] == 3 + 5
        _assert_same_capture(got, want[mode])
    assert counter.syncs == 2


def test_device_hash_equals_the_compiled_one():
    """The hash folded on the device (int64 arithmetic read as uint64) equals the host's."""
    from aligntools.tracker.row_hash import row_hash, torch_row_hash

    g = torch.Generator().manual_seed(3)
    for d in (1, 2, 7, 64, 513):
        x = torch.randn(9, d, generator=g) * 1e3
        assert torch.equal(torch_row_hash(x.view(torch.int32)), row_hash(x))


def _assert_same_capture(got, want) -> None:
    assert got.sites == want.sites
    for c in ("token_id", "position", "request", "step"):
        np.testing.assert_array_equal(got.dataset[c].values, want.dataset[c].values)
    for site in want.sites:
        a, b = got.dataset[site].values, want.dataset[site].values
        # device sums run in another order than the CPU's: equal to rounding; the rest exactly
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=site)
        if got.mode == "stats":
            np.testing.assert_array_equal(a[:, -1], b[:, -1], err_msg=f"{site} hash")


def _skipped(module: str) -> bool:
    """torch's own Python wrappers and this file's counters: not the caller being checked."""
    return module == __name__ or module.split(".")[0] == "torch"
