"""Stats mode against stats of tensor mode; the byte budget; bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aligntools
from aligntools import CaptureBudgetExceeded
from aligntools.tracker.stats import STAT_NAMES, row_hash, row_stats


def numpy_stats(x: np.ndarray) -> np.ndarray:
    """The stats of each row, written independently with numpy (finite entries only)."""
    x = x.reshape(len(x), -1).astype(np.float64)
    fin = np.where(np.isfinite(x), x, np.nan)
    none = ~np.isfinite(x).any(1)  # rows without a finite entry: every summary is NaN
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        l2 = np.where(none, np.nan, np.sqrt(np.nansum(fin ** 2, 1)))
        out = [np.nanmin(fin, 1), np.nanmax(fin, 1), np.nanmean(fin, 1), l2,
               np.nanmax(np.abs(fin), 1), np.isnan(x).sum(1), np.isinf(x).sum(1)]
    return np.stack(out, 1)


def test_stats_mode_equals_stats_of_tensor_mode(hf_model, ids):
    model = hf_model("tiny-qwen3-moe")
    tensor = aligntools.capture(model, ids, mode="tensor").dataset
    stats = aligntools.capture(model, ids, mode="stats").dataset
    assert list(stats["stat"].values) == list(STAT_NAMES)
    for site in tensor.data_vars:
        got = stats[site].values
        assert stats[site].dims == ("token", "stat")
        np.testing.assert_allclose(got[:, :7], numpy_stats(tensor[site].values), rtol=1e-12, atol=1e-12,
                                   equal_nan=True, err_msg=site)
        rows = torch.from_numpy(tensor[site].values).reshape(len(got), -1)
        np.testing.assert_array_equal(got[:, 7], row_hash(rows).numpy(), err_msg=site)


def test_hash_is_content_equality():
    x = torch.randn(4, 33)
    x[2] = x[0]
    h = row_hash(x)
    assert h[0] == h[2] and len(set(h.tolist())) == 3
    y = x.clone()
    y[1, 5] = torch.nextafter(y[1, 5], torch.tensor(1e9))  # one ulp
    assert row_hash(y)[1] != h[1]
    assert float(h.max()) < 2 ** 52 and torch.equal(h, h.trunc())


def test_row_stats_widen_to_float32_and_skip_non_finite():
    x = torch.randn(4, 300, dtype=torch.bfloat16)
    x[1, 7], x[2, :] = float("nan"), float("inf")
    got = row_stats(x).numpy()
    wide = x.float()
    np.testing.assert_allclose(got[:, :7], numpy_stats(wide.numpy()), rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_array_equal(got[:, 7], row_hash(wide).numpy())
    np.testing.assert_array_equal(got[:, 5:7], [[0, 0], [1, 0], [0, 300], [0, 0]])


class RawModel(nn.Module):
    """Not a decoder (raw module paths): ``proj`` of width ``width`` after an 8-wide ``emb``;
    with ``blowup``, NaN/inf in its output (token 3 gives inf, negative values NaN)."""

    def __init__(self, width: int = 8, blowup: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, width)
        self.blowup = blowup

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.emb(ids))
        return torch.where(ids[..., None] == 3, torch.full_like(h, float("inf")), h).log() if self.blowup else h


def test_unknown_module_falls_back_to_paths_and_counts_nan_inf():
    torch.manual_seed(0)
    model = RawModel(blowup=True)
    ids = torch.tensor([[1, 3, 5, 7]])
    with pytest.warns(UserWarning, match="no recognisable decoder layers"):
        cap = aligntools.capture(model, ids, sites="proj,logits", mode="stats")
    assert cap.engine == "module" and cap.sites == ["logits", "proj"]
    st = cap.dataset["logits"].sel(stat=["n_nan", "n_inf"]).values
    out = model(ids)[0]
    np.testing.assert_array_equal(st[:, 0], torch.isnan(out).sum(-1).numpy())
    np.testing.assert_array_equal(st[:, 1], torch.isinf(out).sum(-1).numpy())


def test_raw_paths_of_other_widths_get_their_own_dim_in_every_capture():
    model, ids = RawModel(width=12), torch.tensor([[1, 3, 5]])
    for _ in range(2):  # the second capture reuses the cached layouts: same dims
        with pytest.warns(UserWarning, match="no recognisable decoder layers"):
            ds = aligntools.capture(model, ids, sites="emb,proj", progress=False).dataset
        assert ds["emb"].dims == ("token", "feature") and ds.sizes["feature"] == 8
        assert ds["proj"].dims == ("token", "feature.proj") and ds.sizes["feature.proj"] == 12
        np.testing.assert_array_equal(ds["proj"].values, model(ids)[0].detach().numpy())


def test_unknown_site_pattern_lists_available_sites(hf_model):
    with pytest.raises(ValueError, match=r"'L9\.nope'.*available sites: embed, L0\.attn_norm"):
        aligntools.Tracker(hf_model("tiny-llama"), sites="L9.nope")


def test_bad_input_ids_and_target():
    with pytest.raises(ValueError, match=r"\[batch, seq\]"), pytest.warns(UserWarning, match="raw module paths"):
        aligntools.capture(RawModel(), torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="cannot capture a str"):
        aligntools.Tracker("gpt2")


def test_budget_error_keeps_what_was_captured(hf_model, ids):
    model = hf_model("tiny-llama")
    row = 7 * 2 * 128 * 4  # one [14, hidden] float32 site
    with pytest.raises(CaptureBudgetExceeded, match="budget_bytes") as err:
        aligntools.capture(model, ids, sites="embed,L*.resid_post", budget_bytes=3 * row)
    part = err.value.capture
    assert not part.complete and part.sites == ["embed", "L0.resid_post", "L1.resid_post"]
    assert part.dataset.nbytes <= 3 * row + 4 * 14 * 8  # + the token coords


def test_budget_downgrades_to_stats(hf_model, ids):
    model = hf_model("tiny-llama")
    full = aligntools.capture(model, ids, sites="embed,L*.resid_post", mode="stats").dataset
    cap = aligntools.capture(model, ids, sites="embed,L*.resid_post", budget_bytes=3 * 7 * 2 * 128 * 4,
                             on_budget="stats")
    assert cap.mode == "stats" and cap.complete and "downgraded to stats" in cap.dataset.attrs["notes"]
    for site in full.data_vars:
        np.testing.assert_array_equal(cap.dataset[site].values, full[site].values)


def test_token_filter_keeps_selected_rows(hf_model, ids):
    cap = aligntools.capture(hf_model("tiny-llama"), ids, sites="L0.resid_post,logprobs",
                             token_filter=lambda meta: meta.position >= 5)
    full = aligntools.capture(hf_model("tiny-llama"), ids, sites="L0.resid_post,logprobs")
    keep = full.dataset["position"].values >= 5
    np.testing.assert_array_equal(cap.dataset["L0.resid_post"].values, full.dataset["L0.resid_post"].values[keep])
    # the next token of a kept row is known even when that row itself is filtered out
    np.testing.assert_array_equal(cap.dataset["logprobs"].values, full.dataset["logprobs"].values[keep])
