"""``quiet(progress)``: one switch for third-party progress bars and known-harmless warnings.

Why here: both sides call third-party loaders (transformers ``from_pretrained`` in minirl and the
labs, vLLM in aligntools' adapters), and a caller's ``progress=False`` must silence every bar its
call causes, not only the project's own tqdm bars. minirl is the lowest layer both import, so the
mechanism lives once, here. Bars drawn in Jupyter as widgets read "Error displaying widget: model
not found" once a notebook is saved and reopened; the warnings below are printed in red on every
vLLM start or weight sync although nothing is wrong.

Warnings are filtered by name (logger + message start, or category + message), never by a blanket
filter: anything not listed still shows.
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

HARMLESS_LOGS: dict[str, tuple[str, ...]] = {
    # vLLM weight sync (``sync_weights``): layers without checkpoint weights (RotaryEmbedding's
    # cos/sin cache is computed, not loaded) keep their tensors; vLLM logs it per layer per sync.
    "vllm.model_executor.model_loader.reload.layerwise": ("%s: Failed to load weights",),
    # the trainer's fp32 state dict into a bf16 engine: vLLM casts it, as intended, and logs each tensor
    "vllm.model_executor.models.utils": ("Attempted to load weight %s with dtype %s into",),
    # vLLM's CPU build with a CUDA-only Triton wheel: vLLM falls back to its torch paths, as intended
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
    # CPU boxes without numactl: vLLM only loses its NUMA pinning hint
    "vllm.utils.numa_utils": ("Failed to run `numactl --show`", "`numactl --show` returned no output"),
    # SGLang's CPU path as minirl/sglang sets it up: torch-native attention (no CUDA graphs to
    # capture), one rank (no shared-memory all-reduce), a sandbox's fixed open-file limit
    "sglang.srt.arg_groups.attention_hook": ("Cuda graph is disabled because of using torch native attention",),
    "sglang.srt.distributed.bootstrap": ("init_cpu_threads_env and shared memory based AllReduce is disabled",),
    "sglang.srt.utils.common": ("Fail to set RLIMIT_NOFILE",),
    # a local, single-user Ray cluster started by the async lab
    "ray._private.authentication.authentication_token_setup": ("Token authentication is disabled",),
}
"""Logger name -> message format strings (their start) that are known to be harmless."""

HARMLESS_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # torch's deprecated alias, touched by vLLM's and Triton's start-up module scans
    (FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated"),
    # SGLang's FLA ops on a CPU box: they fall back to torch, as intended
    (UserWarning, r"Triton is not supported on current platform, roll back to CPU"),
    # SGLang's quantization modules, imported whatever the model: these checkpoints are neither
    (UserWarning, r"Only CUDA, HIP and XPU support AWQ currently"),
    (UserWarning, r"Only CUDA, MUSA and NPU support GGUF quantization currently"),
)
"""(category, message regex) of Python warnings that are known to be harmless."""


class _DropKnown(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def install_filters() -> None:
    """Drop the ``HARMLESS_LOGS`` records and ``HARMLESS_WARNINGS`` for the rest of the process
    (idempotent). Called by ``quiet``; a CLI calls it once at start."""
    for name, prefixes in HARMLESS_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(prefixes))
    for category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


_progress_enabled = [True]


def progress_enabled() -> bool:
    """False inside ``quiet(progress=False)``: what a loader (vLLM's ``use_tqdm_on_load``) should use."""
    return _progress_enabled[-1]


@contextmanager
def quiet(progress: bool) -> Iterator[None]:
    """Within the block: named harmless warnings dropped; with ``progress=False`` also transformers'
    and huggingface_hub's bars ("Loading weights", "Writing model shards") and, through
    ``progress_enabled``, vLLM's "Loading safetensors checkpoint shards". Restores the previous
    state on exit, so nested calls and a caller that wants bars later both behave."""
    install_filters()
    if progress:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    _progress_enabled.append(False)
    try:
        yield
    finally:
        _progress_enabled.pop()
        if was_enabled:
            hf_logging.enable_progress_bar()


P = ParamSpec("P")
R = TypeVar("R")


def quiet_when_asked(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator for a function with a ``progress`` parameter: the whole call runs inside
    ``quiet(progress)``, so ``progress=False`` silences the bars of every loader it reaches, not only
    the function's own tqdm (a lab that loads three models drew three "Loading weights" bars)."""
    signature = inspect.signature(fn)
    default = signature.parameters["progress"].default  # KeyError at import: decorating the wrong function

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        progress = signature.bind_partial(*args, **kwargs).arguments.get("progress", default)
        with quiet(bool(progress)):
            return fn(*args, **kwargs)

    return call
