"""``labs.reproduce``: the registry's entries, the runner's files and table, one real small entry."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xarray as xr
from matplotlib.figure import Figure

from labs import reproduce


def test_registry_has_the_entries_with_paper_numbers():
    assert {"checklist", "decode_drift", "c3po", "c3po_reward", "roc"} <= set(reproduce.REGISTRY)
    for rep in reproduce.REGISTRY.values():
        assert rep.finding and rep.paper and callable(rep.run)
        # where the paper says it, or, for a paper not in docs/ whose text was not at hand, that in words
        assert "§" in rep.paper or "Fig" in rep.paper or "section not checked" in rep.paper, \
            f"{rep.name}: cite the paper's section"


def test_registering_a_name_twice_raises():
    with pytest.raises(ValueError, match="twice"):
        reproduce.reproduction("roc", finding="x", paper="y")(lambda small: reproduce.Outcome("z"))


def test_runner_writes_netcdf_png_summary_and_table(tmp_path, monkeypatch):
    def fake(small: bool) -> reproduce.Outcome:
        fig = Figure()
        fig.subplots().plot([0, 1])
        curve = xr.DataArray([[0.2, 0.5], [0.4, 0.7], [0.6, 0.9]], dims=("seed", "step"),
                             coords={"seed": [0, 1, 2], "step": [0, 4]})
        return reproduce.Outcome("0.5x", {"log": xr.Dataset({"v": ("step", [1.0, 2.0])})}, {"plot": fig}, {"ratio": 0.5},
                                 {"acc": curve}, "abc")

    monkeypatch.setitem(reproduce.REGISTRY, "fake", reproduce.Reproduction("fake", "a finding", "Paper §1: 2x", fake))
    assert reproduce.main(["--only", "fake", "--small", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "fake"
    assert sorted(p.name for p in folder.iterdir()) == ["log.nc", "plot.png", "summary.json"]
    s = json.loads((folder / "summary.json").read_text())
    assert s["command"] == "python -m labs.reproduce --only fake --small" and s["numbers"] == {"ratio": 0.5}
    assert s["held_out_sha256"] == "abc" and s["bands"]["acc"]["seeds"] == [0, 1, 2]
    assert s["bands"]["acc"]["per_seed"] == {"0": [0.2, 0.5], "1": [0.4, 0.7], "2": [0.6, 0.9]}
    assert xr.open_dataset(folder / "log.nc", engine="h5netcdf")["v"].values.tolist() == [1.0, 2.0]
    table = reproduce.table([s])
    assert list(table.columns) == ["finding", "paper", "ours", "seeds", "command", "time"]
    assert table.loc[0, "ours"] == "0.5x" and table.loc[0, "seeds"] == 3
    md = (tmp_path / "results.md").read_text().splitlines()
    assert md[0] == "| finding | paper | ours | seeds | command | time |" and md[2].startswith("| a finding | Paper §1: 2x | 0.5x | 3 |")


def test_band_is_the_mean_with_a_t_interval_over_seeds():
    """Three seeds at 0.2, 0.4, 0.6: mean 0.4, sd 0.2, t(0.975, 2) = 4.303 -> 0.4 ± 0.497. A step no
    seed reached is left out; a step only one seed reached has a mean and no interval."""
    curve = xr.DataArray([[0.2, 0.1, math.nan, 1.0], [0.4, math.nan, math.nan, 2.0], [0.6, math.nan, math.nan, 3.0]],
                         dims=("seed", "step"), coords={"seed": [3, 4, 5], "step": [0, 1, 2, 3]})
    b = reproduce.band(curve)
    assert b["step"] == [0, 1, 3] and b["mean"] == pytest.approx([0.4, 0.1, 2.0])
    half = 4.302653 * 0.2 / math.sqrt(3)
    assert b["ci95"][0] == pytest.approx([0.4 - half, 0.4 + half], rel=1e-5) and b["ci95"][1] is None
    assert b["per_seed"]["4"] == [0.4, None, 2.0]
    assert reproduce.ci_text(*reproduce.mean_ci(np.array([20.0, 40.0, 60.0])), " %") == "40.0 % [-9.7, 89.7]"


def test_seeds_of_an_entry_share_one_held_out_set(zoo):
    """``train_seeds`` runs each seed on the split of ``SPLIT_SEED``: the seed alone would redraw the
    held-out problems, so the band would mix policy spread with held-out draws."""
    from minirl import tasks
    from minirl.training.train_config import TrainConfig

    cfg = TrainConfig(model=str(zoo("tiny-qwen3-moe")), sft_steps=0, n_train=8, n_eval=4, prompts_per_step=2,
                      group_size=4, max_new_tokens=4, steps=1, eval_every=1, checkpoint_every=0, progress=False)
    log, checksum = reproduce.train_seeds(cfg, (0, 1))
    assert log["seed"].values.tolist() == [0, 1] and log["eval_accuracy"].sel(step=0).notnull().all()
    assert not np.array_equal(log["abs_dlogp_mean"].sel(seed=0), log["abs_dlogp_mean"].sel(seed=1))  # own samples
    task = tasks.get(cfg.task, **cfg.task_kwargs)
    assert checksum == reproduce.held_out_sha256(tasks.splits(task, 8, 4, reproduce.SPLIT_SEED)[1])
    assert checksum != reproduce.held_out_sha256(tasks.splits(task, 8, 4, 1)[1])


def test_roc_entry_runs_small(tmp_path, capsys):
    assert reproduce.main(["--small", "--only", "roc", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "roc" / "summary.json").read_text())
    assert "GRPO-RoC" in s["ours"] and "Fig. 4" in s["paper"] and "over 2 seeds" in s["ours"]
    assert 0 <= s["numbers"]["GRPO_end"] <= 1 and 0 <= s["numbers"]["GRPO-RoC_end"] <= 1
    band = s["bands"]["error_ratio_positives GRPO-RoC"]
    assert band["seeds"] == list(reproduce.SMALL_SEEDS) and band["step"] == list(range(8))
    assert all(lo <= m <= hi for m, (lo, hi) in zip(band["mean"], band["ci95"]))
    assert {"curves.nc", "roc_fig4.png"} <= set(s["files"])
    assert "python -m labs.reproduce --only roc --small" in capsys.readouterr().out


def test_real_model_figure_draws_held_out_accuracy_only_where_evaluated():
    """Mean over seeds per evaluated step, the 95 % interval shaded."""
    from minirl.training import run_log

    seeds = [run_log.to_dataset([{"step": 0, "reward": 0.25 + d, "eval_accuracy": 0.2 + d}, {"step": 1, "reward": 0.5},
                                 {"step": 2, "reward": 0.75, "eval_accuracy": 0.4 + d}]).swap_dims(row="step")
             for d in (-0.1, 0.1)]
    ax = reproduce.real_model_figure(xr.concat(seeds, "seed").assign_coords(seed=[0, 1])).axes[0]
    acc, reward = ax.get_lines()
    assert acc.get_xdata().tolist() == [0, 2] and acc.get_ydata().tolist() == pytest.approx([20.0, 40.0])
    assert reward.get_xdata().tolist() == [0, 1, 2] and reward.get_ydata().tolist() == pytest.approx([25.0, 50.0, 75.0])
    y = ax.collections[0].get_paths()[0].vertices[:, 1]  # the held-out band; half-width t(0.975, 1) * sd / sqrt(2)
    assert (y.min(), y.max()) == pytest.approx((20.0 - 127.062, 40.0 + 127.062), abs=0.01)


def test_real_model_rl_config_is_icepop_on_vllm_with_a_held_out_curve():
    from minirl.training.train_config import TrainConfig

    cfg = TrainConfig.from_yaml(reproduce.REAL_MODEL_CONFIG)
    assert (cfg.task, cfg.engine, cfg.correction, cfg.sft_steps) == ("chat_arithmetic", "vllm", "icepop", 0)
    assert cfg.eval_every and cfg.n_eval >= 64  # a held-out curve, on enough problems to see 15 points


def test_an_entry_that_loads_a_model_draws_no_loader_bar(tmp_path, monkeypatch, zoo, capfd):
    """``make reproduce`` printed transformers' "Loading weights" bar for every model an entry loaded,
    though every entry calls its lab with ``progress=False``."""
    import transformers

    path = zoo("tiny-llama")

    def loads(small: bool) -> reproduce.Outcome:
        transformers.AutoModelForCausalLM.from_pretrained(path)
        return reproduce.Outcome("loaded")

    monkeypatch.setitem(reproduce.REGISTRY, "loads", reproduce.Reproduction("loads", "f", "Paper §1", loads))
    capfd.readouterr()
    reproduce.run_one(reproduce.REGISTRY["loads"], tmp_path)
    out = capfd.readouterr()
    assert "Loading weights" not in out.err + out.out
    transformers.AutoModelForCausalLM.from_pretrained(path)  # outside the runner the bar is back
    assert "Loading weights" in capfd.readouterr().err


def test_mismatch_growth_entry_runs_small(tmp_path, capsys):
    """The monitor's reproduce entry from the CLI: both arms' readings, figures and the computed comparison."""
    assert reproduce.main(["--small", "--only", "mismatch_growth", "--out", str(tmp_path)]) == 0
    out = tmp_path / "mismatch_growth"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ours"].startswith("the median site error changed ")
    assert "; the median attn_out error changed " in summary["ours"]  # then per kind of site
    assert "; the median router_logits error changed " in summary["ours"]  # the tiny MoE's router too
    assert {"median_site_error_factor none", "median_site_error_factor icepop",
            "median_attn_out_error_factor none", "median_mlp_out_error_factor icepop"} <= set(summary["numbers"])
    assert (out / "mismatch_growth_kinds.png").stat().st_size > 0
    for arm in ("none", "icepop"):
        assert (out / f"mismatch_growth_{arm}.png").stat().st_size > 0
        ds = xr.open_dataset(out / f"monitor_{arm}.nc")
        assert ds["monitor_rel_l2"].dims == ("monitor_step", "site") and list(ds["monitor_step"].values) == [0, 2, 4]
