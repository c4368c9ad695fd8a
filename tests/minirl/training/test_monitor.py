"""The mismatch monitor inside a run (issue 40): ``monitor_every: K`` writes per-site error, first
divergence and routing flips to ``metrics.nc`` and a heatmap, names a planted mismatch at its
site, follows the weights the engine really serves (sync and async), and costs nothing when off."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import yaml

from labs import cli
from minirl.training import monitor as monitor_door
from minirl.training import run_dir, run_log
from minirl import train

PLANTED = {"engine": "minirl:aligned,rmsnorm_eps=0.001", "engine_dtype": "float32",
           "monitor_sites": "L*.attn_norm,L*.attn_out,L*.router_logits,L*.mlp_out,L*.topk_ids"}
"""An engine aligned with the fp32 trainer everywhere but one knob, RMSNorm's epsilon (config.json's
1e-6 on the trainer): the first norm is where the error starts."""


def test_mlab_train_with_the_monitor_writes_arrays_heatmap_and_tensorboard(quick_config, tmp_path, capsys):
    config = {**quick_config().to_dict(), **PLANTED, "steps": 4, "monitor_every": 2, "report_to": "tensorboard"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--config", str(path)]) == 0
    out = tmp_path / "run"
    said = capsys.readouterr().out
    assert "mismatch monitor: " in said and "first divergence at L0.attn_norm from step 0 to 4" in said
    ds = run_log.load(out / "metrics.nc")
    assert ds["monitor_step"].values.tolist() == [0, 2, 4]  # step 0, every 2nd, the final policy
    assert ds["monitor_rel_l2"].dims == ("monitor_step", "site")
    assert ds["monitor_routing_flips"].dims == ("monitor_step", "layer") and ds["layer"].values.tolist() == [0, 1, 2, 3]
    sites = ds["site"].values.tolist()  # execution order
    assert sites[:4] == ["L0.attn_norm", "L0.attn_out", "L0.router_logits", "L0.mlp_out"] and len(sites) == 16
    assert ds["monitor_first_divergence"].values.tolist() == ["L0.attn_norm"] * 3  # the planted site
    assert (ds["monitor_rel_l2"].sel(site="L0.attn_norm").values > 1e-2).all()
    assert "monitor.png" in run_dir.read_manifest(out) and (out / "monitor.png").stat().st_size > 10_000

    png = tmp_path / "sites.png"
    assert cli.main(["plot", str(out), "--sites", "--out", str(png)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == str(png) and printed[1].endswith("first divergence at L0.attn_norm from step 0 to 4.")
    from matplotlib.image import imread

    img = imread(png)[..., :3]
    assert img.shape[1] > 800 and img.std() > 0.05

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    flips = [e.value for e in board.Scalars("monitor_routing_flips/L1")]
    assert flips == pytest.approx(ds["monitor_routing_flips"].sel(layer=1).values.tolist())
    assert [e.step for e in board.Scalars("monitor_rel_l2/L3.mlp_out")] == [0, 2, 4]


def test_quantized_weights_are_monitored(moe_path, hf_moe):
    """Any knob, quantized weights included: int8 weights diverge from the first captured site on."""
    from aligntools.monitor import MismatchMonitor
    from minirl import Engine, Knobs

    engine = Engine.from_pretrained(moe_path, "float32", Knobs.aligned().replace(weights="int8"))
    probe = torch.randint(3, 500, (1, 48), generator=torch.Generator().manual_seed(0))
    reading = MismatchMonitor(monitor_door.DEFAULT_SITES).measure(0, hf_moe, engine, probe)
    assert reading.first_divergence == "L0.attn_out" and reading.rel_l2["L0.attn_out"] > 1e-3
    assert set(reading.routing_flips) == {0, 1, 2, 3}


def test_tensor_mode_reads_exact_errors_that_stats_mode_bounds_from_below(moe_path, hf_moe):
    """``monitor_mode: tensor``: every site's error is the exact one, at least the stats-mode lower
    bound (a stats comparison can miss an error, never invent one); routing flips from the sorted
    ids equal those from the order-free stats at top-2 (exact for k <= 4)."""
    from aligntools.monitor import MismatchMonitor
    from minirl import Engine, Knobs

    engine = Engine.from_pretrained(moe_path, "float32", Knobs.aligned().replace(weights="int8"))
    probe = torch.randint(3, 500, (1, 48), generator=torch.Generator().manual_seed(0))
    stats = MismatchMonitor(monitor_door.DEFAULT_SITES).measure(0, hf_moe, engine, probe)
    exact = MismatchMonitor(monitor_door.DEFAULT_SITES, mode="tensor").measure(0, hf_moe, engine, probe)
    assert exact.rel_l2.keys() == stats.rel_l2.keys()
    assert all(exact.rel_l2[s] >= stats.rel_l2[s] * (1 - 1e-9) for s in stats.rel_l2), (exact.rel_l2, stats.rel_l2)
    assert max(exact.rel_l2[s] / stats.rel_l2[s] for s in stats.rel_l2 if stats.rel_l2[s] > 0) > 1.5  # looser bounds
    assert exact.routing_flips == stats.routing_flips and exact.first_divergence == "L0.attn_out"
    with pytest.raises(ValueError, match="monitor mode must be 'stats' or 'tensor'; got 'exact'"):
        MismatchMonitor(monitor_door.DEFAULT_SITES, mode="exact")


def test_async_monitor_reads_the_weights_the_engine_serves(quick_config):
    """An fp32-aligned engine one update behind the trainer would differ by the update (~1e-3 here);
    the async monitor loads the published weights first, so every reading is at fp32 noise, read
    exactly (``monitor_mode: tensor``, from the config)."""
    result = train(quick_config(engine="minirl:aligned", engine_dtype="float32", mode="async", steps=3,
                                monitor_every=1, monitor_mode="tensor", lr=1e-2))
    ds = run_log.load(result.log_path)
    assert (ds["grad_norm"].values > 0).any()  # the weights moved: a reading behind them would show it
    assert ds["monitor_step"].values.tolist() == [0, 1, 2, 3]
    assert np.nanmax(ds["monitor_rel_l2"].values) < 1e-5
    assert ds["monitor_first_divergence"].values.tolist() == [""] * 4


def test_monitor_off_writes_nothing_and_on_perturbs_nothing_and_resumes(quick_config, monkeypatch):
    """Off: nothing built, imported or written. On: the same training numbers (the monitor draws no
    random number and changes no weight), and a resumed run continues its readings without repeating one."""
    def never(*args, **kwargs):
        raise AssertionError("the monitor was built with monitor_every: 0")

    monkeypatch.setattr(monitor_door, "load", never)
    off = train(quick_config(steps=2, out_dir=str(quick_config().out_dir) + "-off"))
    ds = run_log.load(off.log_path)
    assert not [v for v in [*ds.data_vars, *ds.coords] if str(v).startswith("monitor")] and "site" not in ds.dims
    assert run_dir.read_manifest(off.out_dir) == list(run_dir.OWNED)
    monkeypatch.undo()

    on = train(quick_config(steps=2, checkpoint_every=2, monitor_every=1))
    same = [k for k in off.rows[0] if not k.startswith("time_")]
    assert [{k: repr(r[k]) for k in same} for r in on.rows] == [{k: repr(r[k]) for k in same} for r in off.rows]
    resumed = train(quick_config(steps=3, checkpoint_every=2, monitor_every=1), resume=True)
    assert run_log.load(resumed.log_path)["monitor_step"].values.tolist() == [0, 1, 2, 3]


def test_config_check_refuses_what_the_monitor_cannot_do(quick_config, monkeypatch):
    with pytest.raises(ValueError, match="monitor_every=5 with n_eval=0: the monitor's probe is held-out problems"):
        quick_config(monitor_every=5, n_eval=0)
    with pytest.raises(ValueError, match="monitor_mode=.exact.; valid: stats, tensor"):
        quick_config(monitor_every=5, monitor_mode="exact")
    with pytest.raises(ValueError, match=r"monitor_every=-1: must be >= 0 \(0 = off\)"):
        quick_config(monitor_every=-1)
    with pytest.raises(ValueError, match="monitor_sites=' ': must not be empty \\(the monitor would watch nothing\\)"):
        quick_config(monitor_every=5, monitor_sites=" ")
    monkeypatch.setattr(monitor_door, "PROVIDER", "no_such_package.monitor:MismatchMonitor")
    with pytest.raises(ValueError, match=r"monitor_every=5 needs no_such_package.monitor \(the mismatch monitor lives "
                                         r"in aligntools, which is not importable here\)"):
        quick_config(monitor_every=5)
    quick_config(monitor_every=0)  # off: aligntools is never looked for


def test_minirl_reaches_the_monitor_only_by_its_import_path():
    """The door names aligntools as a string: importing minirl's side loads no aligntools module."""
    import subprocess

    code = ("import sys, minirl.training.monitor, minirl.training.lifecycle; "
            "print([m for m in sys.modules if m.startswith('aligntools')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
