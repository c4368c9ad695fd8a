"""Token alignment: prefill vs decode layouts, permuted batches, mismatched tokens."""

from __future__ import annotations

import numpy as np
import pytest

import aligntools
from aligntools.analyzer.token_align import align, next_token_ids


def as_decode(ds, prompt: int = 5):
    """The same tokens laid out like a decode capture: prompt rows at step 0 (request-major),
    then one row per request for each decode step k at position prompt - 1 + k."""
    pos, req = ds["position"].values, ds["request"].values
    step = np.maximum(pos - (prompt - 1), 0)
    order = np.lexsort((req, pos, step))  # step-major, then request
    out = ds.isel(token=order)
    return out.assign_coords(step=("token", step[order]))


def test_prefill_vs_decode_lines_up_by_request_and_position(synth):
    dec = as_decode(synth)
    assert not np.array_equal(dec["request"].values, synth["request"].values)  # really reordered
    cmp = aligntools.compare(synth, dec)
    assert cmp.passes and cmp.first_divergence is None
    assert cmp.table["rel_l2"].max() == 0
    tok = cmp.per_token("L0.q")
    last = tok[(tok.request == 1) & (tok.position == 7)]
    assert last["step_a"].item() == 0 and last["step_b"].item() == 3


def test_decode_error_is_reported_at_its_token(synth):
    dec = as_decode(synth)
    row = int(np.flatnonzero((dec["request"].values == 0) & (dec["position"].values == 6))[0])
    dec["L2.attn_out"].values[row] *= 1.01
    tok = aligntools.compare(synth, dec).per_token("L2.attn_out")
    bad = tok[tok.rel_l2 > 0]
    assert bad[["request", "position", "step_b"]].values.tolist() == [[0, 6, 2]]


def test_permuted_batch_needs_sequence_mode(synth):
    swapped = synth.assign_coords(request=("token", 1 - synth["request"].values))
    with pytest.raises(ValueError, match=r"request=0, position=0: id_a=\d+, id_b=\d+"):
        aligntools.compare(synth, swapped)
    cmp = aligntools.compare(synth, swapped, align="sequence")
    assert cmp.passes and cmp.table["rel_l2"].max() == 0


def test_length_mismatch_names_first_missing_token(synth):
    short = synth.isel(token=np.flatnonzero(synth["position"].values < 6))
    with pytest.raises(ValueError, match=r"request=0, position=6\) is only in a"):
        aligntools.compare(synth, short)
    al = align(synth, short, "prefix")
    assert len(al) == 12 and al.dropped_a == 4 and al.dropped_b == 0


def test_prefix_mode_stops_at_first_differing_token(synth):
    other = synth.copy(deep=True)
    ids = other["token_id"].values.copy()
    first = np.flatnonzero((other["request"].values == 1) & (other["position"].values == 3))[0]
    ids[first] = (ids[first] + 1) % 32
    other = other.assign_coords(token_id=("token", ids))
    with pytest.raises(ValueError, match="request=1, position=3"):
        align(synth, other)
    al = align(synth, other, "prefix")
    kept = al.tokens.groupby("request")["position"].max().to_dict()
    assert kept == {0: 7, 1: 2}


def test_next_token_is_the_following_position(synth):
    al = align(synth, synth)
    nxt = next_token_ids(synth, al)
    ids = synth["token_id"].values
    assert nxt[0] == ids[1] and nxt[7] == -1 and nxt[8] == ids[9]


def test_next_token_ids_match_a_dict_lookup_on_repeats_gaps_and_empty_captures():
    """The sort-based lookup against the definition written as a dict: first row of each
    (request, position) wins, keys absent from the capture give -1, any request ids."""
    import pandas as pd
    import xarray as xr

    from aligntools.analyzer.token_align import Alignment

    rng = np.random.default_rng(7)
    for n, m in [(0, 5), (5, 0), (0, 0)] + [tuple(rng.integers(1, 40, 2)) for _ in range(200)]:
        req, pos, ids = rng.integers(-2, 3, n), rng.integers(-1, 6, n), rng.integers(0, 50, n)
        ds = xr.Dataset(coords={"request": ("token", req), "position": ("token", pos),
                                "token_id": ("token", ids), "step": ("token", np.zeros(n, np.int64))})
        asked = pd.DataFrame({"request": rng.integers(-2, 3, m), "position": rng.integers(-2, 6, m)})
        first: dict[tuple[int, int], int] = {}
        for key in zip(req.tolist(), pos.tolist(), ids.tolist()):
            first.setdefault(key[:2], key[2])
        want = [first.get((r, p + 1), -1) for r, p in zip(asked["request"], asked["position"])]
        got = next_token_ids(ds, Alignment(None, None, asked, "strict", 0, 0))
        assert got.dtype == np.int64 and got.tolist() == want


def test_unknown_mode_is_rejected(synth):
    with pytest.raises(ValueError, match="unknown align mode"):
        align(synth, synth, "fuzzy")
