"""Notebook 04 §4's reading of one run's mismatch monitor: measured values, terms explained (hand-made logs)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from labs.icepop_lab import monitor_reading


def log(where: list[str], flips: list[list[float]]) -> xr.Dataset:
    steps = np.arange(len(where)) * 5
    return xr.Dataset({"monitor_first_divergence": ("monitor_step", np.array(where, dtype=object)),
                       "monitor_routing_flips": (("monitor_step", "layer"), np.array(flips))},
                      coords={"monitor_step": steps, "layer": [0, 1]})


def test_none_is_explained_and_each_site_gets_its_steps():
    text = monitor_reading(log(["L1.attn_out", "L1.attn_out", "", ""], [[0.0, 0.0]] * 3 + [[0.02, 0.04]]))
    assert ("was `L1.attn_out` at steps 0, 5; no site (every site's error within its float64 noise floor) at steps "
            "10, 15.") in text
    assert "moved to none" not in text
    assert "went from 0 % at step 0 to 3 % at step 15." in text


def test_a_flat_zero_reads_zero_not_a_rounding_residue():
    text = monitor_reading(log(["embed", "embed"], [[0.0, 0.0], [0.0, 0.0]]))
    assert "was `embed` at steps 0, 5." in text and "from 0 % at step 0 to 0 % at step 5" in text and "e-" not in text
