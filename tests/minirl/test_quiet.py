"""minirl.quiet: progress=False silences transformers' bars and restores them; named warnings only."""

from __future__ import annotations

import logging
import warnings

import pytest
from transformers.utils import logging as hf_logging

from minirl.quiet import (
    HARMLESS_LOGS,
    install_filters,
    progress_enabled,
    quiet,
    quiet_when_asked,
)


def test_quiet_false_disables_and_restores_transformers_bars():
    hf_logging.enable_progress_bar()
    with quiet(progress=False):
        assert not hf_logging.is_progress_bar_enabled() and not progress_enabled()
        with quiet(progress=True):  # an inner call that wants bars does not re-enable the outer silence
            assert not progress_enabled()
    assert hf_logging.is_progress_bar_enabled() and progress_enabled()


def test_quiet_true_leaves_bars_on():
    hf_logging.enable_progress_bar()
    with quiet(progress=True):
        assert hf_logging.is_progress_bar_enabled() and progress_enabled()


def test_named_vllm_weight_sync_logs_are_dropped_and_others_kept(caplog):
    install_filters()
    name = "vllm.model_executor.model_loader.reload.layerwise"
    logger = logging.getLogger(name)
    with caplog.at_level(logging.WARNING, logger=name):
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: something else", "RotaryEmbedding")
    assert [r.getMessage() for r in caplog.records] == ["RotaryEmbedding: something else"]
    assert name in HARMLESS_LOGS


def test_install_filters_is_idempotent():
    install_filters()
    install_filters()
    for name in HARMLESS_LOGS:
        assert len([f for f in logging.getLogger(name).filters if type(f).__name__ == "_DropKnown"]) == 1


def test_only_the_named_future_warning_is_ignored():
    install_filters()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        install_filters()  # catch_warnings reset the filters: install inside
        warnings.warn("`torch.distributed.reduce_op` is deprecated, use ReduceOp", FutureWarning)
        warnings.warn("another deprecation", FutureWarning)
    assert [str(w.message) for w in caught] == ["another deprecation"]


@quiet_when_asked
def _loads(path, progress: bool = True) -> bool:
    """What a lab does: loads a checkpoint with transformers, reports whether its bar would draw."""
    import transformers

    transformers.AutoConfig.from_pretrained(path)
    return hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize(("args", "kwargs", "bars"), [((), {"progress": False}, False), ((False,), {}, False),
                                                       ((), {}, True), ((), {"progress": True}, True)])
def test_a_call_with_progress_false_runs_without_loader_bars(zoo, args, kwargs, bars):
    hf_logging.enable_progress_bar()
    assert _loads(zoo("tiny-llama"), *args, **kwargs) is bars
    assert hf_logging.is_progress_bar_enabled()  # restored after the call


def test_decorating_a_function_without_progress_fails_at_import():
    with pytest.raises(KeyError, match="progress"):
        quiet_when_asked(lambda path: path)
