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
