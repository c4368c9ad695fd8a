"""Bad input degrades to findings: disjoint sites, stats vs tensor, dtypes, shapes, types."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

import aligntools
from aligntools.tracker import row_hash
from aligntools.tracker.stats import STAT_NAMES, row_stats
from tests.aligntools.analyzer.analyzer_synth import make_capture, noise


def to_stats(ds: xr.Dataset) -> xr.Dataset:
    """The stats-mode capture of the same run (Tracker's row_stats on every float site)."""
    out = {}
    for site in ds.data_vars:
        x = torch.from_numpy(np.ascontiguousarray(ds[site].values))
        out[site] = (("token", "stat"), row_stats(x).numpy(), ds[site].attrs)
    return xr.Dataset(out, coords={**{c: ds.coords[c] for c in ("request", "position", "token_id", "step")},
                                   "stat": list(STAT_NAMES)},
                      attrs={**ds.attrs, "mode": "stats", "row_hash": row_hash.SCHEME})


def test_disjoint_sites_compare_the_intersection(synth):
    a = synth.drop_vars(["L0.q", "logits"])
    b = synth.drop_vars(["L2.v"])
    cmp = aligntools.compare(a, b)
    assert "L0.q" not in cmp.table.index and "L2.v" not in cmp.table.index
    assert cmp.only_a == ("L2.v",) and cmp.only_b == ("L0.q", "logits")
    assert "only in b (not compared): L0.q, logits" in cmp.summary()


def test_no_common_site_is_a_clear_error(synth):
    with pytest.raises(ValueError, match="share no site"):
        aligntools.compare(synth[["L0.q"]], synth[["L0.k"]])


def test_stats_vs_tensor_compares_stats_as_lower_bounds(synth):
    st = to_stats(synth)
    same = aligntools.compare(synth, st)
    assert same.passes and set(same.table["basis"].dropna()) == {"stats", "ids"}
    assert same.table.loc["L0.q", "exact"] == 1.0  # content hashes agree
    b = noise(synth, {"L1.mlp_out": 1e-2})
    full, bound = aligntools.compare(synth, b), aligntools.compare(synth, to_stats(b))
    assert 0 < bound.table.loc["L1.mlp_out", "rel_l2"] <= full.table.loc["L1.mlp_out", "rel_l2"]
    assert bound.table.loc["L1.mlp_out", "exact"] == 0.0
    assert aligntools.compare(st, to_stats(b)).table.loc["L1.mlp_out", "rel_l2"] == pytest.approx(
        bound.table.loc["L1.mlp_out", "rel_l2"])


def test_different_dtypes_use_the_coarser_tolerance(synth):
    b = synth.copy(deep=True)
    b["L0.q"].attrs["dtype"] = "bfloat16"
    b["L0.k"] = b["L0.k"].astype(np.float64)
    cmp = aligntools.compare(synth, b)
    assert cmp.table.loc["L0.q", "dtype"] == "bfloat16" and cmp.table.loc["L0.k", "rel_l2"] == 0
    assert cmp.table.loc["L0.q", "limit"] > 100 * cmp.table.loc["L0.v", "limit"]


def test_shape_mismatch_is_skipped_with_a_note(synth):
    b = synth.drop_vars("L0.v").assign({"L0.v": (("token", "kv4"), np.zeros((16, 4), np.float32))})
    cmp = aligntools.compare(synth, b)
    assert cmp.table.loc["L0.v", "basis"] == "skipped" and cmp.failures == ["L0.v"]  # not compared: fails
    assert "L0.v: not comparable" in cmp.summary()


def test_accepts_capture_objects_and_rejects_other_types(synth):
    cap = aligntools.Capture(synth)
    assert aligntools.compare(cap, synth).passes
    with pytest.raises(TypeError, match="expected a Capture"):
        aligntools.compare(np.zeros(3), synth)


def test_raw_dataset_without_token_coords_compares_by_row(synth):
    bare = synth.drop_vars(["request", "position", "token_id", "step"])
    assert aligntools.compare(bare, bare).passes
    with pytest.raises(ValueError, match="only in a"):
        aligntools.compare(bare, bare.isel(token=slice(0, 10)))


def test_sites_filter(synth):
    cmp = aligntools.compare(synth, synth, sites="L1.*,logits")
    assert cmp.sites[0] == "L1.attn_norm" and cmp.sites[-1] == "logits"
    with pytest.raises(ValueError, match="matches no site"):
        aligntools.compare(synth, synth, sites="L9.*")


def test_moe_and_dense_captures_of_different_sizes():
    a, b = make_capture(n_layers=2, moe_layers=(0,)), make_capture(n_layers=2)
    b = b.assign_coords(token_id=a["token_id"])
    cmp = aligntools.compare(a, b)
    assert "L0.router_logits" in cmp.only_a and len(cmp.routing) == 0


def test_stats_mode_sees_an_error_on_rows_where_the_trusted_side_is_zero():
    a = make_capture(seed=0)
    a["L1.mlp_out"][:3] = 0.0  # e.g. a padded or masked row that is exactly zero on the trainer
    b = a.copy(deep=True)
    b["L1.mlp_out"][:3] = 5.0
    cmp = aligntools.compare(to_stats(a), to_stats(b))
    assert cmp.table.loc["L1.mlp_out", "rel_l2"] > 0
    assert "L1.mlp_out" in cmp.failures


def test_hashes_of_different_schemes_make_exact_unknown_not_false(synth):
    """A stats capture written before captures recorded their scheme (no ``row_hash`` attr)
    against one of today: the bounds are compared, bit-equality is reported unknown."""
    today = to_stats(synth)
    older = today.copy()
    older.attrs = {k: v for k, v in today.attrs.items() if k != "row_hash"}
    same = aligntools.compare(today, synth)
    assert same.results["L0.q"].summary["rel_l2"] == 0 and (same.results["L0.q"].rows["exact"] == 1).all()
    for a, b in ((older, synth), (synth, older), (older, today)):
        res = aligntools.compare(a, b).results["L0.q"]
        assert np.isnan(res.rows["exact"]).all() and "hash their rows differently" in res.note
        assert "unrecorded" in res.note and res.summary["rel_l2"] == 0
    text = aligntools.compare(older, synth).summary()  # one note line for all the sites it concerns
    assert text.count("hash their rows differently") == 1 and f"({len(to_stats(synth).data_vars)} sites)" in text
    both_old = aligntools.compare(older, older).results["L0.q"]  # the same (older) scheme: comparable
    assert (both_old.rows["exact"] == 1).all() and not both_old.note


def test_the_fail_line_names_the_first_sites_and_counts_the_rest():
    """A real model fails at hundreds of sites; the verdict line names the first ones."""
    from aligntools.analyzer.comparison import _fail_line

    sites = [f"L{i}.q" for i in range(20)]
    assert _fail_line(sites) == "FAIL at 20 sites: " + ", ".join(sites[:8]) + ", and 12 more"
    assert _fail_line(sites[:3]) == "FAIL at 3 sites: L0.q, L1.q, L2.q"
