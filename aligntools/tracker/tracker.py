"""``Tracker``: capture sites of any engine while it runs; ``capture``: the one-call form.

Ring-linear 5.2.1: "the same input must be provided to both the training and inference
frameworks, with activations compared module-by-module and layer-by-layer". The Tracker is
that capture, under the engine-neutral site vocabulary (docs/sites.md), in prefill and
in decode (every forward / engine step under the ``with`` block is captured, decode steps
labelled with their step), without blowing memory (stats mode, ``budget_bytes``, streaming
to ``out``).

Budget policy (``budget_bytes``): before a value that would take the capture past the
budget is stored, ``on_budget="error"`` (default) raises ``CaptureBudgetExceeded`` out of
the engine call; everything captured until then is kept, marked partial
(``complete=0``), and reachable as ``tracker.capture`` or ``exc.capture``.
``on_budget="stats"`` instead reduces what was captured to per-token stats and goes on in
stats mode (noted in the ``notes`` attr); it needs the capture in memory (no ``out``).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Literal

import torch
from tqdm.auto import tqdm

from aligntools.adapters import adapter_for
from aligntools.tracker import row_hash
from aligntools.tracker.capture_dataset import Capture
from aligntools.tracker.journal import open_store, partial_path
from aligntools.tracker.provenance import library_versions
from aligntools.tracker.recorder import CaptureBudgetExceeded, Recorder, TokenFilter
from aligntools.sites import select

Mode = Literal["tensor", "stats"]


class Tracker:
    """Context manager: ``with Tracker(model, sites="L*.resid_post,logits") as t: model(ids)``;
    then ``t.capture`` is the ``Capture``.

    ``target``: a transformers model, a minirl ``Engine``, an nnsight model, or any
    ``nn.Module`` (unrecognised ones are captured at raw module paths, with a warning).
    ``sites``: glob patterns, comma separated or a list; an unknown pattern raises listing
    the available sites. ``token_filter(meta) -> BoolTensor[N]`` keeps a subset of token
    rows. ``out``: stream the capture to a ``.nc`` / ``.zarr`` file while it runs (a crash
    leaves a readable file with ``complete=0``); finished steps are written whenever
    ``flush_bytes`` of them are buffered. One writer per ``out``: while a Tracker writes it,
    a second one (this process or another) is refused at ``with`` with a ``CaptureWriteError``.
    ``progress``: tqdm bar of captured tokens (None: only on a terminal). ``copy``: tensor mode copies every value in its hook; by
    default it keeps transformers' tensors by reference and raises
    ``CapturedValueModified`` if one is written in place after its hook
    (``aligntools.tracker.borrowed``).
    """

    def __init__(self, target: object, sites: str | list[str] = "*", mode: Mode = "tensor",
                 budget_bytes: int | None = None, token_filter: TokenFilter | None = None, *,
                 out: str | os.PathLike | None = None, on_budget: Literal["error", "stats"] = "error",
                 progress: bool | None = None, flush_bytes: int = 64 << 20, copy: bool = False) -> None:
        if out is not None and on_budget == "stats" and mode == "tensor":
            raise ValueError("on_budget='stats' needs the capture in memory (rows already streamed to "
                             "`out` cannot be reduced); use on_budget='error' or out=None")
        _check_options(mode, budget_bytes, flush_bytes, on_budget)
        if not isinstance(copy, bool):
            raise ValueError(f"copy must be True or False, got {copy!r}")
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"progress must be True, False or None (a bar only on a terminal), got {progress!r}")
        _check_sites(sites)
        self.adapter = adapter_for(target)
        self.available = self.adapter.available_sites()
        self.sites = select(sites, self.available)
        if not self.sites:
            raise ValueError(f"sites={sites!r} selects no site: give glob patterns such as '*' or "
                             f"'L*.resid_post,logits'")
        self.mode, self.budget_bytes, self.on_budget = mode, budget_bytes, on_budget
        self.token_filter, self.out, self.progress = token_filter, out, progress
        self.flush_bytes, self.copy = flush_bytes, copy
        self._recorder: Recorder | None = None
        self._capture: Capture | None = None
        self._failure: BaseException | None = None  # why __exit__ could not finish the capture

    def __enter__(self) -> "Tracker":
        attrs = self._attrs()
        store = open_store(self.out, {**attrs, "mode": self.mode, "complete": 0})
        self._recorder = Recorder(self.sites, self.mode, store, budget_bytes=self.budget_bytes,
                                  on_budget=self.on_budget, token_filter=self.token_filter,
                                  flush_bytes=None if self.out is None else self.flush_bytes, progress=self.progress,
                                  copy=self.copy)
        self._attrs_at_start = attrs
        self.adapter.attach(self._recorder)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.adapter.detach()
        rec = self._recorder
        try:
            rec.finish(self._attrs_at_start, complete=exc_type is None)
        except BaseException as failure:
            self._failure = failure
            raise
        if exc_type is None and rec.n_tokens == 0:
            warnings.warn(_nothing_captured(rec), stacklevel=2)
        if self.out is None:
            self._capture = Capture(rec.dataset())
        else:
            self._capture = Capture.load(self.out, lazy=True) if exc_type is None else _load_partial(self.out)
        if isinstance(exc, CaptureBudgetExceeded):
            exc.capture = self._capture
        self._recorder = None  # its buffers are the capture's now: a kept Tracker must not hold a second copy

    @property
    def capture(self) -> Capture:
        """The capture, available once the ``with`` block has exited."""
        if self._failure is not None:
            raise RuntimeError(f"no capture: finishing it failed with {type(self._failure).__name__}: "
                               f"{self._failure}") from self._failure
        if self._capture is None:
            raise RuntimeError("the capture is available after the `with Tracker(...)` block exits")
        return self._capture

    def _attrs(self) -> dict:
        info = self.adapter.describe()
        path = info.get("model_path")  # lets replay() find the weights without being told
        return {"engine": self.adapter.engine, "dtype": info["dtype"], "knobs": json.dumps(info["knobs"]),
                "versions": json.dumps(library_versions()), "model_hash": info["model_hash"],
                "row_hash": row_hash.SCHEME, "sites_requested": ",".join(self.sites),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **({"model_path": str(path)} if path and os.path.isdir(path) else {}),
                **({"unquantized": json.dumps(info["unquantized"])} if info.get("unquantized") else {})}


def _load_partial(path: str | os.PathLike) -> Capture:
    """The rows an interrupted run flushed: its journal, never an older file at ``path``."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the caller is already getting the exception
        return Capture.load(partial_path(path))


def _check_options(mode: str, budget_bytes: object, flush_bytes: object, on_budget: object) -> None:
    """Option errors before anything is attached or written (a bad value must not cost a run,
    nor the journal an interrupted earlier run left at ``out``)."""
    if mode not in ("tensor", "stats"):
        raise ValueError(f"mode must be 'tensor' or 'stats', got {mode!r}")
    if on_budget not in ("error", "stats"):
        raise ValueError(f"on_budget must be 'error' or 'stats', got {on_budget!r}")
    for name, value in (("budget_bytes", budget_bytes), ("flush_bytes", flush_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive integer number of bytes, got {value!r}")


def _check_sites(sites: object) -> None:
    """``sites`` is a comma-separated string or a list of strings (glob patterns)."""
    if isinstance(sites, str):
        return
    if not isinstance(sites, (list, tuple)) or not all(isinstance(s, str) for s in sites):
        raise ValueError(f"sites must be glob patterns, a comma-separated string or a list of strings such as "
                         f"'*' or ['L*.resid_post', 'logits']; got {sites!r}")


def _nothing_captured(rec: Recorder) -> str:
    """Why a capture that finished without an error holds no token."""
    if not rec.saw_forward:
        return ("the capture holds no token: no forward of the tracked model ran inside the `with` block "
                "(calling a submodule, e.g. model.model(...), is not seen: call the model itself)")
    return "the capture holds no token: token_filter kept none of the tokens"


def _checked_ids(input_ids: object, vocab: int | None) -> torch.Tensor:
    """``input_ids`` as int64 [batch, seq], refused before anything is written: a bad id
    fails inside the forward, after ``out``'s journal was started again."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() != 2 or ids.numel() == 0 or ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"input_ids must be a non-empty integer tensor [batch, seq]; got {tuple(ids.shape)} "
                         f"{ids.dtype}")
    if ids.is_meta:
        raise ValueError("input_ids are on the meta device, which holds shapes but no values; give real token "
                         "ids (a CPU or accelerator tensor)")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or (vocab is not None and hi >= vocab):
        raise ValueError(f"input_ids must lie in [0, {vocab if vocab is not None else 'vocab'}) for this model; "
                         f"got ids from {lo} to {hi}")
    return ids.to(torch.int64)


def _warn_without_entry(target: object) -> None:
    """A transformers model whose family has no ``minirl.families`` entry has its sites read as the
    Llama shape, unproved: say so, and how to prove it (``mlab check`` always does)."""
    config = getattr(target, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        return
    from minirl.families import has_entry

    if not has_entry(config):
        warnings.warn(f"{model_type}: no `Family` entry in minirl/families.py, so its sites are read as the Llama "
                      f"shape, unproved; `aligntools.invariants.prove_model(model).require()` proves that reading or "
                      f"refuses it (mlab check runs it)", stacklevel=3)


def capture(target: object, input_ids: torch.Tensor, sites: str | list[str] = "*", mode: Mode = "tensor",
            *, batch_size: int | None = None, **tracker_kwargs) -> Capture:
    """Run one teacher-forced forward (``engine.score`` for a minirl Engine) of
    ``input_ids`` [batch, seq] under a Tracker and return its Capture.

    ``batch_size`` splits the rows into several calls (request indices stay global), with a
    progress bar; other keyword arguments go to ``Tracker``.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size <= 0):
        raise ValueError(f"batch_size must be a positive integer (or None for one call); got {batch_size!r}")
    _warn_without_entry(target)
    tracker = Tracker(target, sites, mode, **tracker_kwargs)
    ids = _checked_ids(input_ids, tracker.adapter.vocab_size())
    step = batch_size or ids.shape[0]
    with tracker:
        starts = range(0, ids.shape[0], step)
        for lo in tqdm(starts, desc="capture batches", disable=len(starts) < 2 or None, leave=False):
            tracker.adapter.run(ids[lo:lo + step])
    return tracker.capture
