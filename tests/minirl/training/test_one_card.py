"""RL on one device: the minirl rollout engine lives on the trainer's device, the weight sync
copies into the engine's own tensors there without reading anything back to the host, and each
step's time splits into rollout, logprobs, update and sync in ``metrics.nc``.

On CPU the trainer's device is the host, so "no host round-trip" is checked as what it would cost
on a card: no value read back to Python (``aten._local_scalar_dense``, a device sync) and no copy
to another device during the sync. The CUDA run of the same path is the GPU check's ``gpu_rl``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

TIME_SPLIT = ("time_rollout", "time_old_logprobs", "time_update", "time_sync")


class OpLog(TorchDispatchMode):
    """Every aten op run inside it, with the devices of its tensor outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, set[str]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        self.ops.append((str(func), {str(t.device) for t in outs if isinstance(t, torch.Tensor)}))
        return out


@pytest.fixture
def trainer(quick_config):
    from minirl.training.trainer import Trainer

    return Trainer(quick_config(device="cpu", sft_steps=0, steps=1, engine="minirl:aligned",
                                engine_dtype="float32", correction="icepop", router_replay="r3"))


def test_the_engine_is_built_on_the_trainers_device_and_synced_in_place(trainer):
    weights = trainer.engine.model.w
    before = {name: t.data_ptr() for name, t in weights.items()}
    assert {t.device for t in weights.values()} == {trainer.device}
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.25)
    with OpLog() as log:
        trainer.engine.load_weights(trainer.model)
    assert {name: t.data_ptr() for name, t in weights.items()} == before  # copied into, not replaced
    assert torch.equal(weights["embed"], trainer.model.get_input_embeddings().weight.detach())  # fp32: exact
    assert log.ops, "the sync ran no tensor op at all"
    assert not [op for op, _ in log.ops if "_local_scalar_dense" in op]  # nothing read back to the host
    assert {d for _, devices in log.ops for d in devices} <= {str(trainer.device)}


def test_each_step_logs_its_time_split_and_the_sync(trainer):
    import xarray as xr

    result = trainer.run()
    row = result.rows[0]
    assert all(row[k] > 0 for k in TIME_SPLIT), {k: row[k] for k in TIME_SPLIT}
    with xr.open_dataset(result.log_path) as ds:
        assert set(TIME_SPLIT) <= set(ds.data_vars)
        assert float(ds["time_sync"][0]) == pytest.approx(row["time_sync"])
