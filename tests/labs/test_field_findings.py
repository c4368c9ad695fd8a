"""The on_policy, r3_layers and lr0 entries (labs/on_policy_lab.py, r3_layers_lab.py, lr0_lab.py):
each verdict follows the rule its module states before the runs (numbers planted into the verdict
function), and each ``--small`` entry runs end to end and reports what its numbers say."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from labs import lr0_lab, on_policy_lab, r3_layers_lab, reproduce


def _on_policy(max_dlogp: dict[str, list[list[float]]]) -> xr.Dataset:
    """Planted per-(setting) [seed][step] max |Δ| on one model; the mean |Δ| is a tenth of it."""
    settings = list(max_dlogp)
    mx = np.array([max_dlogp[s] for s in settings])[None]  # [model, setting, seed, step]
    dims = ("model", "setting", "seed", "step")
    coords = {"model": ["m"], "setting": settings, "seed": list(range(mx.shape[2])), "step": list(range(mx.shape[3]))}
    rollout = np.ones_like(mx) * np.array([2.0 if s == "typical_bf16" else 3.0 for s in settings])[None, :, None, None]
    return xr.Dataset({"abs_dlogp_max": (dims, mx), "abs_dlogp_mean": (dims, mx / 10),
                       "mismatch_kl_k3": (dims, mx ** 2), "time_rollout": (dims, rollout)}, coords=coords)


def test_on_policy_is_bitwise_only_when_every_step_of_every_seed_is_zero():
    ds = _on_policy({"hf_exact_fp32_eager": [[0, 0], [0, 0], [0, 0]],
                     "hf_exact_bf16_eager": [[0, 0], [0, 1e-7], [0, 0]],  # one step of one seed moved a bit
                     "typical_bf16": [[0.03, 0.02], [0.01, 0.05], [0.02, 0.02]]})
    table, numbers = on_policy_lab.verdict(ds)
    assert table["bitwise"].tolist() == [True, False, False]
    assert table.loc[("m", "hf_exact_bf16_eager"), "zero_steps"] == 5
    assert table.loc[("m", "typical_bf16"), "max_dlogp"] == pytest.approx(np.mean([0.03, 0.05, 0.02]))
    assert table.loc[("m", "hf_exact_fp32_eager"), "rollout_vs_typical"] == pytest.approx(1.5)
    assert numbers["bitwise m hf_exact_fp32_eager"] == 1.0 and numbers["bitwise m typical_bf16"] == 0.0
    invariance = pd.DataFrame({"distinct": {False: 3, True: 1}}).rename_axis("batch_invariant")
    invariance.attrs["batch_sizes"] = "1..64 (64 sizes)"
    text = on_policy_lab.sentence(table, invariance)
    assert text.startswith(f"{on_policy_lab.RULE}: holds for m hf_exact_fp32_eager;")
    assert "batch_invariant=False: 3 distinct" in text and "batch_invariant=True: 1 distinct" in text


def test_on_policy_with_no_setting_at_zero_says_so():
    table, _ = on_policy_lab.verdict(_on_policy({"hf_exact_bf16_sdpa": [[1e-3], [2e-3]]}))
    invariance = pd.DataFrame({"distinct": {False: 1, True: 1}}).rename_axis("batch_invariant")
    invariance.attrs["batch_sizes"] = "1..8"
    assert on_policy_lab.sentence(table, invariance).startswith(f"{on_policy_lab.RULE}: no setting holds")


def _r3(token_share: list[float], k3_none: list[float], k3_r3: list[float]) -> xr.Dataset:
    n = len(token_share)
    return xr.Dataset({"flip_rate": (("trainer_dtype", "seed", "layer"), np.full((1, n, 3), 0.05)),
                       "token_flip_share": (("trainer_dtype", "seed"), [token_share]),
                       "generated_flip_share": (("trainer_dtype", "seed"), [token_share]),
                       "k3": (("trainer_dtype", "seed", "replay"), np.array([list(zip(k3_none, k3_r3))]))},
                      coords={"trainer_dtype": ["float32"], "seed": list(range(n)), "layer": [0, 1, 2],
                              "replay": ["none", "R3"]})


@pytest.mark.parametrize("share,none,r3,reproduced,lowers", [
    ([0.9, 0.95, 0.92], [2e-3, 3e-3, 2.5e-3], [1e-3, 1e-3, 1e-3], 1.0, 1.0),
    ([0.2, 0.25, 0.22], [1e-3, 1e-3, 1e-3], [1e-3, 1.1e-3, 0.9e-3], 0.0, 0.0),
])
def test_r3_layers_verdict_follows_its_rule(share, none, r3, reproduced, lowers):
    text, numbers = r3_layers_lab.verdict(_r3(share, none, r3))
    assert numbers["reproduced float32"] == reproduced and numbers["r3_lowers_kl float32"] == lowers
    assert numbers["layer_flip_rate float32"] == pytest.approx(0.05)
    assert numbers["k3_ratio float32"] == pytest.approx(np.mean(np.array(none) / np.array(r3)))
    assert text.startswith("over 3 seeds: float32 trainer: 5.0%")
    assert ("not reproduced" not in text) == bool(reproduced)


def _lr0(lr0: list[list[float]], normal: list[list[float]]) -> xr.Dataset:
    values = np.array([lr0, normal])
    return xr.Dataset({"abs_dlogp_mean": (("lr", "seed", "step"), values)},
                      coords={"lr": ["lr0", "normal"], "seed": list(range(values.shape[1])),
                              "step": list(range(values.shape[2]))})


def test_lr0_verdict_follows_its_rule():
    flat = [[1.0, 1.1, 0.9, 1.0], [1.0, 0.9, 1.1, 1.0], [1.1, 1.0, 1.0, 0.9]]
    rising = [[1.0, 1.5, 2.0, 2.5], [1.0, 1.6, 2.1, 2.4], [1.0, 1.4, 2.0, 2.6]]
    text, numbers = lr0_lab.verdict(_lr0(flat, rising))
    assert numbers["flat_lr0"] == 1.0 and numbers["grows_normal"] == 1.0
    assert numbers["slope_normal"] == pytest.approx(np.mean([0.5, 0.47, 0.54]), abs=0.02)
    assert ": flat;" in text and text.endswith("grows")
    _, numbers = lr0_lab.verdict(_lr0(rising, flat))
    assert numbers["flat_lr0"] == 0.0 and numbers["grows_normal"] == 0.0


def test_lr0_freeze_keeps_every_weight_bit():
    """AdamW at lr 0 (no weight decay) after a real gradient: the weights are the same bits."""
    import torch

    layer = torch.nn.Linear(4, 4)
    before = layer.weight.detach().clone()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3, weight_decay=0.0, fused=True)

    class _Trainer:  # what ``freeze`` reads: the optimizer
        pass

    trainer = _Trainer()
    trainer.opt = opt
    lr0_lab.freeze(trainer)
    layer(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert torch.equal(layer.weight, before)


@pytest.mark.parametrize("name", ["on_policy", "r3_layers", "lr0"])
def test_small_entry_runs_and_states_its_verdict(tmp_path, name):
    assert reproduce.main(["--small", "--only", name, "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["command"] == f"python -m labs.reproduce --only {name} --small"
    nums = summary["numbers"]
    if name == "on_policy":
        assert summary["ours"].startswith(on_policy_lab.RULE)
        zero = {k: v for k, v in nums.items() if k.startswith("zero_steps")}
        assert zero and all(nums[k.replace("zero_steps", "bitwise")] == float(v == 2) for k, v in zero.items())
        assert nums["distinct_greedy batch_invariant=True"] == 1.0
        assert nums["bitwise tiny-qwen3 per_token_bf16"] == 1.0  # the setting that holds the rule (docs/rl.md)
    elif name == "r3_layers":
        assert 0 <= nums["layer_flip_rate float32"] <= nums["token_flip_share float32"] <= 1
        assert nums["k3_none float32"] >= 0 and nums["k3_R3 float32"] >= 0
    else:
        assert summary["bands"]["abs_dlogp_mean lr0"]["seeds"] == [0, 1]
        assert nums["flat_lr0"] in (0.0, 1.0) and nums["grows_normal"] in (0.0, 1.0)
    assert (tmp_path / name / f"{name}.png").exists()


def test_an_arm_is_reused_only_under_its_own_recipe_and_written_whole(tmp_path):
    """``on_policy_lab.cached`` (every entry's arms): same recipe read back, another recipe measured again
    (a full-size entry whose sizes changed must not read the old arms), no temporary left beside it."""
    calls = []

    def compute() -> xr.Dataset:
        calls.append(1)
        return xr.Dataset({"x": ("step", [float(len(calls))])})

    cache = tmp_path / "arms" / "a_seed0.nc"
    assert float(on_policy_lab.cached(cache, "r1", compute)["x"][0]) == 1.0
    assert float(on_policy_lab.cached(cache, "r1", compute)["x"][0]) == 1.0 and len(calls) == 1
    assert float(on_policy_lab.cached(cache, "r2", compute)["x"][0]) == 2.0 and len(calls) == 2
    assert xr.load_dataset(cache, engine="h5netcdf").attrs["recipe"] == "r2"
    assert [p.name for p in cache.parent.iterdir()] == ["a_seed0.nc"]
