"""``labs.reproduce``: the registry's entries, the runner's files and table, one real small entry."""

from __future__ import annotations

import json

import pytest
import xarray as xr
from matplotlib.figure import Figure

from labs import reproduce


def test_registry_has_the_entries_with_paper_numbers():
    assert {"checklist", "decode_drift", "c3po", "c3po_reward", "roc"} <= set(reproduce.REGISTRY)
    for rep in reproduce.REGISTRY.values():
        assert rep.finding and rep.paper and callable(rep.run)
        assert "§" in rep.paper or "Fig" in rep.paper, f"{rep.name}: cite the paper's section"


def test_registering_a_name_twice_raises():
    with pytest.raises(ValueError, match="twice"):
        reproduce.reproduction("roc", finding="x", paper="y")(lambda small: reproduce.Outcome("z"))


def test_runner_writes_netcdf_png_summary_and_table(tmp_path, monkeypatch):
    def fake(small: bool) -> reproduce.Outcome:
        fig = Figure()
        fig.subplots().plot([0, 1])
        return reproduce.Outcome("0.5x", {"log": xr.Dataset({"v": ("step", [1.0, 2.0])})}, {"plot": fig}, {"ratio": 0.5})

    monkeypatch.setitem(reproduce.REGISTRY, "fake", reproduce.Reproduction("fake", "a finding", "Paper §1: 2x", fake))
    s = reproduce.run_one(reproduce.REGISTRY["fake"], tmp_path, small=True)
    folder = tmp_path / "fake"
    assert sorted(p.name for p in folder.iterdir()) == ["log.nc", "plot.png", "summary.json"]
    assert json.loads((folder / "summary.json").read_text()) == s
    assert s["command"] == "python -m labs.reproduce --only fake --small" and s["numbers"] == {"ratio": 0.5}
    assert xr.open_dataset(folder / "log.nc", engine="h5netcdf")["v"].values.tolist() == [1.0, 2.0]
    table = reproduce.table([s])
    assert list(table.columns) == ["finding", "paper", "ours", "command", "time"] and table.loc[0, "ours"] == "0.5x"


def test_roc_entry_runs_small(tmp_path, capsys):
    assert reproduce.main(["--small", "--only", "roc", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "roc" / "summary.json").read_text())
    assert "GRPO-RoC" in s["ours"] and "Fig. 4" in s["paper"]
    assert 0 <= s["numbers"]["GRPO_end"] <= 1 and 0 <= s["numbers"]["GRPO-RoC_end"] <= 1
    assert {"curves.nc", "roc_fig4.png"} <= set(s["files"])
    assert "python -m labs.reproduce --only roc --small" in capsys.readouterr().out


def test_real_model_figure_draws_held_out_accuracy_only_where_evaluated():
    from minirl.training import run_log

    rows = [{"step": 0, "reward": 0.25, "eval_accuracy": 0.2}, {"step": 1, "reward": 0.5},
            {"step": 2, "reward": 0.75, "eval_accuracy": 0.4}]
    acc, reward = reproduce.real_model_figure(run_log.to_dataset(rows)).axes[0].get_lines()
    assert acc.get_xdata().tolist() == [0, 2] and acc.get_ydata().tolist() == pytest.approx([20.0, 40.0])
    assert reward.get_xdata().tolist() == [0, 1, 2] and reward.get_ydata().tolist() == pytest.approx([25.0, 50.0, 75.0])


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
