"""Inputs from a hostile review of ``compare`` / ``mlab diff``: each once passed (or crashed) where it must not.

- a NaN logprob on one side read as "token not captured" (logprobs has no ``emitted`` mask);
- a degenerate ``reference=`` (all-NaN or all-zero site) gave NaN / inf limits: anything passed;
- stats mode dropped rows missing on one side silently, where tensor mode fails;
- tokens left out by the alignment and partial captures were not in the report;
- bare errors: token ids beyond the logits, a zero-width site, a bad ``max_memory``;
- rows of a reordered zarr capture were gathered in one selection: ~3x ``max_memory``;
- ``workers``, ``threshold`` and ``labels`` were taken as given: 0 workers meant every core, a NaN
  threshold hid every divergence, one label failed with an IndexError;
- token coordinates that are not integers: a NaN position became -2**63 and a string request
  failed inside numpy, naming neither the coordinate nor the capture.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest
import torch
import transformers
import xarray as xr

import aligntools
from aligntools import Capture, Tolerance
from aligntools.analyzer import metrics, tiled_scan
from aligntools.analyzer.tolerance import DTYPE_RULES
from aligntools.tracker import files
from labs.cli import main as mlab
from tests.aligntools.analyzer.analyzer_synth import make_capture
from tests.aligntools.analyzer.test_bad_input import to_stats
from tests.aligntools.analyzer.test_pinned_metrics import snapshot


def nan_at(ds: xr.Dataset, site: str, request: int, position: int) -> xr.Dataset:
    """Copy of ``ds`` whose ``site`` row at (request, position) is all NaN."""
    out = ds.copy(deep=True)
    row = (out["request"].values == request) & (out["position"].values == position)
    out[site].values[row] = np.nan
    return out


def tiny_llama(nan_token: int | None = None) -> transformers.LlamaForCausalLM:
    """A 2-layer Llama built from a config and a seed; ``nan_token``: its embedding row is NaN
    (an engine that blows up on that token)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    if nan_token is not None:
        with torch.no_grad():
            model.model.embed_tokens.weight[nan_token] = float("nan")
    return model


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.tensor([[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26, 27, 28]])


# ---------------------------------------------------------------- 1. NaN logprobs


def test_nan_logprob_of_a_token_with_a_successor_fails():
    a = make_capture(seed=0)  # no emitted masks: the successor rule decides
    cmp = aligntools.compare(a, nan_at(a, "logprobs", 0, 3))
    assert not cmp.passes and cmp.failures == ["logprobs"]
    assert cmp.results["logprobs"].summary["nan_rows_b"] == 1
    assert "all-NaN rows that b did compute (a NaN blow-up: fails): logprobs 1" in cmp.summary()
    assert "tokens not captured" not in cmp.summary()


def test_nan_logprob_on_the_trusted_side_fails_too():
    a = make_capture(seed=0)
    cmp = aligntools.compare(nan_at(a, "logprobs", 1, 0), a)
    assert cmp.failures == ["logprobs"] and cmp.results["logprobs"].summary["nan_rows_a"] == 1


def test_engine_that_blows_up_on_a_token_fails_on_logprobs_alone(ids):
    """The review's repro: b's engine gives NaN for every logprob of request 0 (a NaN
    embedding); with only logprobs captured, that read as 7 tokens not captured."""
    a = aligntools.capture(tiny_llama(), ids, sites="logprobs")
    b = aligntools.capture(tiny_llama(nan_token=14), ids, sites="logprobs")
    cmp = aligntools.compare(a, b)
    assert not cmp.passes and cmp.results["logprobs"].summary["nan_rows_b"] == 7


def test_last_token_of_a_shorter_capture_may_lack_its_logprob():
    """A capture that stopped at position 4 never saw token 5: its logprob there is NaN legitimately."""
    a = make_capture(seed=0)
    short = nan_at(a.isel(token=slice(0, 5)), "logprobs", 0, 4)
    for x, y in ((a, short), (short, a)):
        cmp = aligntools.compare(x, y, align="prefix")
        assert cmp.passes, cmp.summary()
        assert cmp.table.loc["logprobs", ["missing_a", "missing_b"]].sum() == 1
        assert "tokens not captured in" in cmp.summary()


def test_successor_rule_reads_each_capture_in_its_own_rows_and_request_ids():
    """b's rows shuffled and its requests renumbered (align='sequence'): a NaN at a row with a
    successor fails, a NaN at a request's last row does not."""
    a = make_capture(seed=0)
    order = np.random.default_rng(3).permutation(a.sizes["token"])
    b = a.assign_coords(request=("token", 1 - a["request"].values)).isel(token=order)
    legit = aligntools.compare(a, nan_at(b, "logprobs", 1, 7), align="sequence")  # b's request 1 is a's 0
    assert legit.passes and legit.table.loc["logprobs", "missing_b"] == 1
    blown = aligntools.compare(a, nan_at(b, "logprobs", 1, 6), align="sequence")
    assert blown.failures == ["logprobs"]


@pytest.mark.parametrize("sites", ["logprobs,L0.q", "logprobs,entropy,L0.q", "*"])
def test_prefill_vs_generate_logprobs_still_pass(ids, sites):
    """Under generate, prompt rows have no logits, so no logprob, though their successor is
    known; with a mask (emitted.logits/entropy) or without one (decoded requests)."""
    model = tiny_llama()
    with aligntools.Tracker(model, sites=sites) as t:
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    prefill = aligntools.capture(model, out[:, :-1], sites=sites)
    cmp = aligntools.compare(prefill, t.capture)
    assert cmp.passes, cmp.summary()
    assert cmp.table.loc["logprobs", "missing_b"] == 14  # 7 prompt rows per request
    gen = t.capture.dataset
    decoded = nan_at(gen, "logprobs", 0, 9)  # a decode row: its successor came a step later
    assert aligntools.compare(prefill, decoded).failures == ["logprobs"]


# ---------------------------------------------------------------- 2. degenerate reference


def test_degenerate_reference_keeps_the_dtype_floor_and_says_so():
    a = make_capture(seed=0)
    b = a.copy(deep=True)
    for site in ("L0.q", "logits"):
        b[site].values[:] *= -3.0
    ref = a.copy(deep=True)
    ref["logits"].values[:] = np.nan  # never emitted (a generate run)
    ref["L0.q"].values[:] = 0.0  # all zero
    cmp = aligntools.compare(a, b, reference=ref)
    assert {"L0.q", "logits"} <= set(cmp.failures)
    default = DTYPE_RULES["float32"].limit()
    assert cmp.table.loc["L0.q", "limit"] == cmp.table.loc["logits", "limit"] == default
    text = cmp.summary()
    assert "L0.q: the reference gives no noise floor here (err(a vs reference) = inf" in text
    assert "logits: the reference gives no noise floor here (err(a vs reference) = nan" in text
    assert aligntools.compare(a, a, reference=ref).passes


@pytest.mark.parametrize("floor", [float("nan"), float("inf"), -1e-3, "0.1", True])
def test_with_noise_floor_refuses_floors_that_pass_anything(floor):
    with pytest.raises(ValueError, match="noise floor of L0.q"):
        Tolerance().with_noise_floor({"L0.q": floor})


# ---------------------------------------------------------------- 3. stats mode, missing rows


def test_stats_rows_missing_on_one_side_fail_like_tensor_mode():
    a = make_capture(seed=0)
    b = a.copy(deep=True)
    b["L0.q"].values[3:8] = np.nan  # b never emitted L0.q for 5 tokens
    tensor = aligntools.compare(a, b)
    for cmp in (aligntools.compare(to_stats(a), to_stats(b)), aligntools.compare(a, to_stats(b)),
                aligntools.compare(to_stats(b), a)):
        assert cmp.failures == tensor.failures == ["L0.q"]
        side = "missing_b" if cmp.table.loc["L0.q", "missing_b"] > 0 else "missing_a"
        assert cmp.table.loc["L0.q", side] == tensor.table.loc["L0.q", "missing_b"] == 5
        assert cmp.table.loc["L0.q", "n_tokens"] == 11 and cmp.table.loc["L0.q", "basis"] == "stats"
        assert "L0.q 5" in cmp.summary()


def test_stats_rows_missing_at_a_sparse_site_are_not_captured():
    a = make_capture(seed=0)
    b = a.copy(deep=True)
    b["logits"].values[:2] = np.nan  # prompt logits a generate run never computed
    cmp = aligntools.compare(to_stats(a), to_stats(b))
    assert cmp.passes and cmp.table.loc["logits", "missing_b"] == 2
    assert "tokens not captured in b (all-NaN rows, left out): logits 2" in cmp.summary()


# ---------------------------------------------------------------- 4. dropped tokens, partial captures


@pytest.fixture
def partial_short(tmp_path) -> tuple[xr.Dataset, str]:
    """(a, path of a's first 5 tokens saved as a partial capture: complete=0)."""
    a = make_capture(seed=0)
    short = a.isel(token=slice(0, 5))
    short.attrs = {**a.attrs, "complete": 0}  # (a new dict: isel shares a's)
    return a, str(Capture(short).save(tmp_path / "short.zarr"))


def test_dropped_tokens_and_a_partial_capture_are_in_the_report(partial_short):
    a, path = partial_short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cmp = aligntools.compare(a, path, align="prefix", labels=("a", "short"))
    assert cmp.passes  # reported, not failed
    text = cmp.summary()
    assert "tokens left out by align=prefix (not compared): 11 of a, 0 of short" in text
    assert "partial capture (complete=0" in text and cmp.partial == ("short",)
    partial = [w for w in caught if "is partial" in str(w.message)]
    assert len(partial) == 1 and partial[0].filename == __file__  # points at the compare call


def test_mlab_diff_prints_dropped_tokens_and_partial_capture(partial_short, tmp_path, capsys):
    a, path = partial_short
    full = str(Capture(a).save(tmp_path / "a.zarr"))
    assert mlab(["diff", full, path, "--align", "prefix"]) == 0
    out, err = capsys.readouterr()
    assert "tokens left out by align=prefix (not compared): 11 of" in out and "partial capture" in out
    assert "mlab diff: warning: capture" in err and "is partial" in err


# ---------------------------------------------------------------- 5. clear errors


def test_token_id_beyond_the_logits_width_is_a_clear_error(tmp_path, capsys):
    a = make_capture(seed=0)  # logits 32 wide
    a = a.assign_coords(token_id=("token", a["token_id"].values + 100))
    with pytest.raises(ValueError, match=r"logits: token id 1\d\d at request 0, position 1 is outside the "
                                         r"logits width 32"):
        aligntools.compare(a, a)
    path = str(Capture(a).save(tmp_path / "oob.zarr"))
    assert mlab(["diff", path, path]) == 2 and "outside the logits width 32" in capsys.readouterr().err


@pytest.mark.parametrize("coord, values, says", [
    ("position", lambda p: np.where(np.arange(len(p)) == 3, np.nan, p), r"'position' .* float64 \(nan at row 3\)"),
    ("position", lambda p: p + 0.5, r"'position' .* float64 \(0.5 at row 0\)"),
    ("request", lambda r: np.array(["x"] * len(r)), r"'request' .* <U1"),
    ("token_id", lambda t: np.full(len(t), 2.0 ** 64), r"'token_id' .* \(1.8446\d*e\+19 at row 0\)"),
])
@pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification")  # the string case
def test_token_coordinates_that_are_not_integers_are_named(coord, values, says, tmp_path, capsys):
    a = make_capture(seed=0)
    bad = a.assign_coords({coord: ("token", values(a[coord].values))})
    with pytest.raises(ValueError, match=says + ".*set them to integers"):
        aligntools.compare(a, bad)
    path = str(Capture(bad).save(tmp_path / "bad.zarr"))
    assert mlab(["diff", str(Capture(a).save(tmp_path / "a.zarr")), path]) == 2
    assert f"'{coord}' of {path}" in capsys.readouterr().err  # names the file


def test_token_coordinates_stored_as_whole_floats_or_unsigned_still_align():
    """A capture whose coordinates another tool widened to float64 (or made unsigned) holds
    the same tokens: it compares equal to the original."""
    a = make_capture(seed=0)
    widened = a.assign_coords(position=("token", a["position"].values.astype(np.float64)),
                              request=("token", a["request"].values.astype(np.uint32)))
    cmp = aligntools.compare(a, widened)
    assert cmp.passes and len(cmp.alignment) == a.sizes["token"] and cmp.table["rel_l2"].max() == 0


def test_zero_width_site_is_skipped_with_a_note():
    a = make_capture(seed=0)
    a["L0.z"] = (("token", "zero"), np.zeros((a.sizes["token"], 0), np.float32))
    cmp = aligntools.compare(a, a, sites="L0.z,L0.q")
    assert cmp.passes and cmp.table.loc["L0.z", "basis"] == "skipped"
    assert "no values per token" in cmp.summary()
    empty = np.zeros((3, 0), np.float32)
    assert (metrics.row_metrics(empty, empty)["n_valid"] == 0).all()  # was StopIteration in _dot_block


@pytest.mark.parametrize("bad", [0, False, True, -1, -(1 << 30), 0.5, float("nan"), float("inf"), "1024"])
def test_max_memory_must_be_a_positive_number_of_bytes(bad):
    a = make_capture(seed=0)
    with pytest.raises(ValueError, match="max_memory must be a positive number of bytes"):
        aligntools.compare(a, a, max_memory=bad)


def test_max_memory_none_and_numbers_are_accepted():
    a = make_capture(seed=0)
    for ok in (None, 1, 1 << 20, np.int64(4096), 2.5e6):
        assert aligntools.compare(a, a, max_memory=ok).passes


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "lots", "0.0000001"])
def test_mlab_diff_max_memory_must_be_positive_mib(bad, capsys):
    with pytest.raises(SystemExit) as e:
        mlab(["diff", "a.zarr", "b.zarr", "--max-memory", bad])
    assert e.value.code == 2 and "must be a positive number of MiB" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [0, -1, 2.5, "2", True])
def test_workers_must_be_a_positive_whole_number(workers):
    """0 used to mean every core, -1 one thread and 2.5 two, silently; "2" failed inside min()."""
    a = make_capture(seed=0)
    with pytest.raises(ValueError, match=r"workers must be a positive whole number of threads"):
        aligntools.compare(a, a, workers=workers)
    with pytest.raises(ValueError, match=r"workers must be a positive whole number of threads"):
        metrics.row_metrics(a["L0.q"].values, a["L0.q"].values, workers=workers)


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), 1, 0.5, -4, "4", None])
def test_growth_threshold_must_be_a_finite_factor_above_one(threshold):
    """A NaN threshold made every jump test False: a planted divergence went unreported."""
    a = make_capture(seed=0)
    with pytest.raises(ValueError, match=r"threshold must be a finite growth factor above 1"):
        aligntools.compare(a, a, threshold=threshold)


def test_a_planted_divergence_is_found_at_any_valid_threshold():
    a = make_capture(seed=0)
    b = a.copy(deep=True)
    b["L1.mlp_out"].values[:] *= 1.01
    for threshold in (1.5, 4, np.float64(10.0)):
        assert aligntools.compare(a, b, threshold=threshold).first_divergence.site == "L1.mlp_out"


@pytest.mark.parametrize("labels", [("x",), ("a", "b", "c"), "ab", ("a", 2), None])
def test_labels_must_be_two_strings(labels):
    a = make_capture(seed=0)
    with pytest.raises(ValueError, match=r"labels must be two strings"):
        aligntools.compare(a, a, labels=labels)


# ---------------------------------------------------------------- 6. reordered rows from a chunked store


def test_rows_gathered_from_zarr_in_any_order_are_the_stored_rows(tmp_path):
    """``tiled_scan._read`` of index arrays (shuffled, repeated, one chunk, exactly a range) from a
    zarr store, read chunk by chunk, gives what numpy indexing gives."""
    x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    xr.Dataset({"v": (("token", "d"), x)}).to_zarr(tmp_path / "v.zarr", encoding={"v": {"chunks": (8, 3)}},
                                                   consolidated=False)
    v = xr.open_zarr(tmp_path / "v.zarr", consolidated=False)["v"]
    rng = np.random.default_rng(0)
    for rows in (rng.permutation(64), rng.integers(0, 64, 50), np.array([5, 3, 3, 7]), np.arange(9, 30)[::-1],
                 np.array([63])):
        np.testing.assert_array_equal(tiled_scan._read(v, rows), x[rows])


def test_reordered_zarr_capture_costs_no_more_memory_than_one_in_order(tmp_path, monkeypatch):
    """The review's repro, smaller: b's rows shuffled in a zarr store. Each tile gathered b's
    rows in one selection, which zarr decodes all at once: 62-75 MiB peak under a 16 MiB cap
    (21 MiB with the rows in order). Chunk by chunk, the shuffled pair costs what the ordered
    one does, and gives the in-memory numbers bit for bit.

    Stored in 1 MiB chunks: either peak jitters by one decoded storage chunk on a busy box
    (zarr's event-loop thread can still hold the last chunk while the next one decodes), which
    at the default 8 MiB failed CI (30 vs 21 MiB, in order 13-29 MiB under load). At 1 MiB the
    jitter stays under the 4 MiB margin, and one selection still costs +20 MiB (26.5 vs 6 MiB)."""
    monkeypatch.setattr(files, "_CHUNK_BYTES", 1 << 20)
    cap, n = 16 << 20, 4096
    rng = np.random.default_rng(0)
    a = make_capture(n_layers=1, requests=n // 8, seq=8)
    a = xr.Dataset({"L0.resid_post": (("token", "d"), rng.standard_normal((n, 2048), dtype=np.float32))},
                   coords=a.coords, attrs=a.attrs)
    b = a.isel(token=rng.permutation(n))
    paths = {name: Capture(ds).save(tmp_path / f"{name}.zarr") for name, ds in (("a", a), ("b", b))}
    metrics.compiled_path_agrees()  # the one-time compile is not capture data,
    aligntools.compare(paths["a"], paths["b"], max_memory=cap, workers=2)  # nor is compiling modules on first import

    def peak(path_b) -> tuple[int, aligntools.Comparison]:
        tracemalloc.start()
        try:
            cmp = aligntools.compare(paths["a"], path_b, max_memory=cap, workers=2)
            return tracemalloc.get_traced_memory()[1], cmp
        finally:
            tracemalloc.stop()

    in_order, _ = peak(paths["a"])
    shuffled, cmp = peak(paths["b"])
    assert shuffled < in_order + (4 << 20), f"{shuffled / 2**20:.1f} MiB vs {in_order / 2**20:.1f} MiB in order"
    assert snapshot(cmp) == snapshot(aligntools.compare(a, b))


# ---------------------------------------------------------------- 7. damaged files


def test_a_damaged_zarr_chunk_is_an_error_naming_the_file_and_the_site(ids, tmp_path, capsys):
    """A truncated chunk made zarr fail with "cannot reshape array of size 25 into shape
    (16, 64)", which names neither the file nor the site."""
    cap = aligntools.capture(tiny_llama(), ids, sites="L0.q,logits", progress=False)
    good, bad = tmp_path / "good.zarr", tmp_path / "bad.zarr"
    cap.save(good)
    cap.save(bad)
    chunk = next(p for p in (bad / "L0.q").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:25])
    with pytest.raises(aligntools.CaptureFileError, match=r"bad\.zarr: site L0\.q cannot be read .* damaged"):
        aligntools.compare(good, bad)
    assert mlab(["diff", str(good), str(bad)]) == 2
    assert "site L0.q cannot be read" in capsys.readouterr().err
