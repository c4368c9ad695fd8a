"""NaN rows: a token one capture never computed, or a NaN blow-up?

Why its own module: a row that is all-NaN on one side only means one of two opposite
things. The Tracker fills rows a site did not emit with NaN (logits of prompt rows under
``generate``, the logprob of a token whose successor never came), and such a row is left
out of the comparison; a row the engine did compute and got NaN is a blow-up and must fail.
This module decides which, per side, from what each capture itself records.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from aligntools import sites as S
from aligntools.analyzer.token_align import Alignment, token_table
from aligntools.tracker.store import EMITTED


# Sites an engine may legitimately leave out for some tokens (the Tracker fills those rows
# with NaN): logits of prompt rows under ``generate``, logprobs of a token with no successor.
# An all-NaN row that its side did compute is a blow-up and fails (``nan_rows``): known from
# the Tracker's ``emitted.<site>`` mask where the capture has one, and at ``logprobs``, which
# has none, from the tokens the capture holds (``_logprob_expected``).
SPARSE_SITES = ("logits", "logprobs", "entropy")
LOGITS_MASKS = (EMITTED + "logits", EMITTED + "entropy")
"""Masks that say where a capture computed logits (entropy is derived from the same rows)."""


def gated_error(site: str, summary: dict) -> float:
    """rel_l2, or inf when values are non-finite: on one side only, or on both (a NaN weight
    both engines read gives NaN at the same elements, which the metrics leave out: it would
    read as agreement). At every other site a row that is NaN on one side only is a NaN
    blow-up, not a missing row: it must fail."""
    one_sided = summary.get("missing_a", 0) + summary.get("missing_b", 0)
    blown = summary.get("nonfinite_mismatch", 0) + summary.get("nonfinite_a", 0) + summary.get("nonfinite_b", 0)
    if blown > 0 or (one_sided > 0 and S.parse(site).kind not in SPARSE_SITES):
        return np.inf
    if summary.get("nan_rows", 0) > 0 or (one_sided > 0 and summary.get("n_tokens", 1) == 0):
        return np.inf  # NaN rows the engine did emit, or no row left to compare at all
    return summary["rel_l2"]


def nan_rows(site: str, a: xr.Dataset, b: xr.Dataset, al: Alignment, rows: dict) -> dict[str, int]:
    """``nan_rows_a``/``nan_rows_b``/``nan_rows``: rows all-NaN on one side although that side's
    engine computed them (a NaN blow-up, not a token the engine never computed), per side and
    in all. ``rows``: the site's per-token arrays, ``missing_a``/``missing_b`` where any."""
    out = {}
    for ds, idx, side in ((a, al.idx_a, "a"), (b, al.idx_b, "b")):
        missing = np.asarray(rows.get("missing_" + side, np.zeros(len(al))), dtype=bool)
        out["nan_rows_" + side] = _computed_rows(site, ds, idx, missing)
    return out | {"nan_rows": out["nan_rows_a"] + out["nan_rows_b"]}


def _computed_rows(site: str, ds: xr.Dataset, idx: np.ndarray | None, missing: np.ndarray) -> int:
    """How many of the aligned rows ``missing`` [N] (all-NaN on this side only) the capture
    ``ds`` did compute: its ``emitted.<site>`` mask says so where it has one (the Tracker's,
    at logits and entropy); at ``logprobs`` the tokens it holds do (``_logprob_expected``)."""
    hit = np.flatnonzero(missing)
    if not len(hit):
        return 0
    rows = hit if idx is None else idx[hit]  # the capture's own rows
    if EMITTED + site in ds.coords:  # (not .get: a miss builds a did-you-mean message, ~0.5 ms)
        return int(np.count_nonzero(np.asarray(ds.coords[EMITTED + site].values)[rows] == 1))
    if S.parse(site).kind == "logprobs":
        return int(np.count_nonzero(_logprob_expected(ds, rows)))
    return 0


def _logprob_expected(ds: xr.Dataset, rows: np.ndarray) -> np.ndarray:
    """[len(rows)] bool: whether capture ``ds`` must hold a logprob at its rows ``rows``.

    The Tracker derives the logprob at (request r, position p) from the logits there and the
    token at (r, p + 1) (``aligntools.tracker.derived``), and writes no mask for it: the row is
    NaN legitimately only where the capture never saw that token, or never computed those
    logits. Where the capture says which logits it computed (``LOGITS_MASKS``) that decides;
    without a mask, a request the capture decoded over several steps (``generate``) may have
    logits only at the last row of each forward, so a row whose successor came in the same
    step is not held against it (a blow-up there reaches that forward's last row too, whose
    successor comes a step later and is checked). Keys are matched vectorised (``_rows_in``)
    on the coordinates every capture has, in the capture's own request ids (not a's, which
    ``align='sequence'`` puts in the alignment).
    """
    t = token_table(ds)
    req, pos, step = (t[c].to_numpy() for c in ("request", "position", "step"))
    r, p, s = req[rows], pos[rows], step[rows]
    expected = _rows_in((r, p + 1), (req, pos))
    for mask in LOGITS_MASKS:
        if mask in ds.coords:
            return expected & (np.asarray(ds.coords[mask].values)[rows] == 1)
    same_step = _rows_in((r, p + 1, s), (req, pos, step))
    return expected & ~(same_step & np.isin(r, _decoded_requests(req, step)))


def _decoded_requests(req: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Request ids whose rows span more than one step (decoded, not one prefill)."""
    pairs = np.unique(np.stack([req, step]), axis=1)  # [2, distinct (request, step)]
    ids, n_steps = np.unique(pairs[0], return_counts=True)
    return ids[n_steps > 1]


def _rows_in(query: tuple[np.ndarray, ...], table: tuple[np.ndarray, ...]) -> np.ndarray:
    """[len(query[0])] bool: whether each row of the integer columns ``query`` occurs among the
    rows of ``table`` (the same columns). The columns are folded into one int64 key per row by
    dense ranks over both, column by column, so ``np.isin`` compares one number per row and
    no product of value ranges can overflow."""
    n = len(query[0])
    key = None
    for q, t in zip(query, table, strict=True):
        _, rank = np.unique(np.concatenate([q, t]), return_inverse=True)
        if key is not None:
            _, rank = np.unique(key * (int(rank.max(initial=0)) + 1) + rank, return_inverse=True)
        key = rank.astype(np.int64).ravel()
    return np.isin(key[:n], key[n:])
