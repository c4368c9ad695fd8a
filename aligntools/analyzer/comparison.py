"""``compare(a, b, reference=None)`` and its result, ``Comparison``.

``compare`` measures capture ``b`` against capture ``a``: anything in the Capture dataset format
(docs/architecture.md) - an ``aligntools.Capture`` (anything with a ``.dataset``), a raw
``xarray.Dataset`` or a path to a saved capture. Bad input degrades to findings rather than
crashes: disjoint site sets are intersected (the rest listed), NaN/Inf are counted, stats-mode
and tensor-mode sites are compared on the stats both have, mismatched trailing shapes are
skipped with a note.

Why one result object with lazy views: the expensive part (reading every captured element) is
done once by ``compare``; the table, first divergence and diagnosis are cheap re-readings of the
same per-token metrics, so notebooks can ask for any of them (figures: ``aligntools.viz``).
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from aligntools import sites as S
from aligntools.analyzer import logit_metrics as L
from aligntools.analyzer import metrics as M
from aligntools.analyzer.diagnosis import Finding, diagnose
from aligntools.analyzer.divergence import GROWTH_THRESHOLD, Divergence, first_divergence, growth
from aligntools.analyzer.nan_rows import gated_error, nan_rows
from aligntools.analyzer.routing_diff import routing_diff, topk_rows
from aligntools.analyzer.stats_metrics import stats_rows, stats_summary
from aligntools.analyzer.tiled_scan import Rows, check_max_memory, check_workers, disk_budget
from aligntools.analyzer.token_align import Alignment, next_token_ids
from aligntools.analyzer.token_align import align as align_tokens
from aligntools.analyzer.tolerance import Tolerance, coarser
from aligntools.tracker import row_hash
from aligntools.tracker.stats import STAT_NAMES, row_stats

GATED_BASES = ("tensor", "stats")
TABLE_COLUMNS = [
    "layer", "basis", "dtype", "n_tokens", "max_abs", "mean_abs", "rel_l2", "cosine", "sqnr_db",
    "permille_err", "ulp_max", "nonfinite_a", "nonfinite_b", "nonfinite_mismatch", "missing_a",
    "missing_b", "exact",
    "set_flip", "order_flip", "kl_max", "kl_mean", "dlogprob_max", "dlogprob_mean",
    "dlogprob_p99", "top1_agree", "limit", "growth", "passes",
]



class SiteVerdict:
    """``passes`` / ``failures`` read off a per-site table with a boolean ``passes`` column
    (shared by ``Comparison`` and the accuracy gate's ``GateReport``)."""

    table: pd.DataFrame

    @property
    def passes(self) -> bool:
        """True when every gated site is within its tolerance limit."""
        return bool(self.table["passes"].all())

    @property
    def failures(self) -> list[str]:
        """Sites over their limit, in execution order."""
        return list(self.table.index[~self.table["passes"]])

@dataclass(frozen=True)
class SiteResult:
    """Metrics of one site. ``rows``: per-token arrays [N]; ``summary``: site-level numbers.

    basis: ``tensor`` (full tensors), ``stats`` (stats-mode lower bounds), ``ids`` (integer
    top-k ids: flips), ``skipped`` (nothing comparable; ``note`` says why).
    comparable: False where the two sides hold values that cannot be compared (another rank,
    shape or kind of number) or no token has a finite value on both sides; such a site fails,
    since nothing shows it agrees (``Comparison.not_compared``).
    """

    site: str
    basis: str
    dtype_a: str
    dtype_b: str
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)
    note: str = ""
    comparable: bool = True

    @property
    def dtype(self) -> str:
        return coarser(self.dtype_a, self.dtype_b)


@dataclass(frozen=True)
class Comparison(SiteVerdict):
    """Capture ``b`` measured against capture ``a`` (``a`` is the trusted side)."""

    results: dict[str, SiteResult]
    alignment: Alignment
    tolerance: Tolerance
    routing: pd.DataFrame
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    threshold: float = GROWTH_THRESHOLD
    labels: tuple[str, str] = ("a", "b")
    partial: tuple[str, ...] = ()
    """Labels of the captures (a, b, ``reference``) saved with ``complete=0``: their run
    stopped before it finished, so tokens it never reached are not in them."""

    @property
    def sites(self) -> list[str]:
        return list(self.results)

    @cached_property
    def table(self) -> pd.DataFrame:
        """Sites x metrics in execution order (index: site name). ``limit`` is the tolerance,
        ``growth`` error / inputs' error, ``passes`` False where error > limit, NaN/Inf
        appear on one side only, or the site could not be compared (``not_compared``); ids sites
        are gated by routing, not here, and pass."""
        recs = [{"site": site, "layer": S.parse(site).layer, "basis": r.basis, "dtype": r.dtype,
                 "n_tokens": len(self.alignment), **r.summary} for site, r in self.results.items()]
        t = pd.DataFrame(recs).set_index("site").reindex(columns=TABLE_COLUMNS)
        g = self.growth.reindex(t.index)
        t["limit"], t["growth"] = g["limit"], g["growth"]
        t["passes"] = ~(g["error"] > g["limit"]) & ~t.index.isin(list(self.not_compared))  # NaN error: not gated
        return t

    @property
    def not_compared(self) -> dict[str, str]:
        """Sites that could not be compared -> why. Each fails: a site whose values cannot be
        compared (an extra dim, integer values, a cut vocabulary) or that is non-finite on both
        sides shows nothing about alignment, and passing it hid a broken capture. A site the user
        means to leave out is left out by name (``sites=``, ``mlab diff --sites``)."""
        return {s: r.note for s, r in self.results.items() if not r.comparable}

    @cached_property
    def growth(self) -> pd.DataFrame:
        """``divergence.growth`` over the gated sites (error, limit, upstream, jumps)."""
        gated = {s: r for s, r in self.results.items() if r.basis in GATED_BASES}
        err = pd.Series({s: gated_error(s, r.summary) for s, r in gated.items()}, dtype=float)
        lim = pd.Series({s: self.tolerance.limit(s, r.dtype) for s, r in gated.items()}, dtype=float)
        return growth(err, lim, self.threshold)

    @cached_property
    def first_divergence(self) -> Divergence | None:
        """Earliest site whose error jumps beyond its inputs' (None when nothing diverges)."""
        return first_divergence(self.growth)

    @cached_property
    def diagnosis(self) -> list[Finding]:
        """Likely causes, in execution order (see ``aligntools.analyzer.diagnosis``)."""
        return diagnose(self.growth, self.table, self.routing, self.per_token)


    def per_token(self, site: str) -> pd.DataFrame:
        """Token rows (request, position, token_id, step_a, step_b) + that site's metrics."""
        if site not in self.results:
            raise KeyError(f"site {site!r} was not compared; compared sites: {', '.join(self.results)}")
        return self.alignment.tokens.assign(**self.results[site].rows)

    def to_xarray(self) -> xr.Dataset:
        """Per-token metrics as a Dataset with dims (site, token); NaN where not applicable."""
        names = sorted({k for r in self.results.values() for k in r.rows})
        n = len(self.alignment)
        data = {k: (("site", "token"), np.stack([
            np.asarray(r.rows.get(k, np.full(n, np.nan)), dtype=np.float64) for r in self.results.values()
        ])) for k in names}
        tok = self.alignment.tokens
        coords = {"site": self.sites, "layer": ("site", [-1 if S.parse(s).layer is None else S.parse(s).layer
                                                         for s in self.sites])}
        coords.update({c: ("token", tok[c].to_numpy()) for c in tok.columns})
        return xr.Dataset(data, coords=coords)

    def summary(self, columns: list[str] | None = None) -> str:
        """Text report: table, disjoint sites, routing diff, first divergence, diagnosis, verdict."""
        cols = columns or ["basis", "dtype", "rel_l2", "max_abs", "cosine", "sqnr_db", "permille_err",
                           "ulp_max", "limit", "growth", "passes"]
        t = self.table
        t = t[[c for c in cols if c in t and t[c].notna().any()]]
        out = [f"{self.labels[0]} vs {self.labels[1]}: {len(self.alignment)} tokens "
               f"(align={self.alignment.mode}), {len(self.results)} sites", *self._coverage(),
               t.to_string(float_format=lambda x: f"{x:.3g}")]
        if "logits" in self.table.index and pd.notna(self.table.loc["logits", "kl_mean"]):
            lg = self.table.loc["logits"]
            out.append(f"logits: KL mean {lg['kl_mean']:.3g} max {lg['kl_max']:.3g}; |dlogprob| mean "
                       f"{lg['dlogprob_mean']:.3g} p99 {lg['dlogprob_p99']:.3g} max {lg['dlogprob_max']:.3g}; "
                       f"top-1 agreement {lg['top1_agree']:.1%}")
        for side, only in ((self.labels[0], self.only_a), (self.labels[1], self.only_b)):
            if only:
                out.append(f"only in {side} (not compared): {', '.join(only)}")
        by_note: dict[str, list[str]] = {}  # one line per note, however many sites share it
        for s, r in self.results.items():
            if r.note:
                by_note.setdefault(r.note, []).append(s)
        notes = [f"{_site_list(sites)}: {note}" for note, sites in by_note.items()
                 if not set(sites) & set(self.not_compared)]
        for side, x in ((self.labels[0], "a"), (self.labels[1], "b")):
            blown = {s: int(r.summary.get("nan_rows_" + x, 0)) for s, r in self.results.items()}
            miss = {s: int(n) - blown.get(s, 0) for s, n in self.table["missing_" + x].items() if n > 0}
            if any(miss.values()):
                notes.append(f"tokens not captured in {side} (all-NaN rows, left out): "
                             + ", ".join(f"{s} {n}" for s, n in miss.items() if n))
            if any(blown.values()):
                notes.append(f"all-NaN rows that {side} did compute (a NaN blow-up: fails): "
                             + ", ".join(f"{s} {n}" for s, n in blown.items() if n))
        if notes:
            out.append("notes: " + "; ".join(notes))
        if self.not_compared:
            out.append(f"{len(self.not_compared)} sites not compared (each fails; to accept that, leave them out "
                       f"with sites= / --sites):")
            by_why: dict[str, list[str]] = {}
            for s, why in self.not_compared.items():
                by_why.setdefault(why, []).append(s)
            out.extend(f"  {_site_list(sites)}: {why}" for why, sites in by_why.items())
        if len(self.routing):
            out.append("routing diff:\n" + self.routing.to_string(float_format=lambda x: f"{x:.3g}"))
        out.append(str(self.first_divergence) if self.first_divergence else "no divergence")
        out.extend(f"  {f}" for f in self.diagnosis)
        out.append("PASS" if self.passes else _fail_line(self.failures))
        return "\n".join(out)

    def _coverage(self) -> list[str]:
        """Summary lines on tokens that were not compared although captured: left out by the
        alignment (``Alignment.dropped_a/_b``), or never captured by a run that stopped early.
        Neither fails a comparison, so the report must say it."""
        al, out = self.alignment, []
        if al.dropped_a or al.dropped_b:
            out.append(f"tokens left out by align={al.mode} (not compared): {al.dropped_a} of {self.labels[0]}, "
                       f"{al.dropped_b} of {self.labels[1]}")
        if self.partial:
            out.append(f"partial capture (complete=0: its run stopped before it finished; tokens it never "
                       f"reached are not compared): {', '.join(self.partial)}")
        return out

    def __repr__(self) -> str:
        fd = self.first_divergence.site if self.first_divergence else None
        return (f"Comparison({len(self.results)} sites, {len(self.alignment)} tokens, "
                f"passes={self.passes}, first_divergence={fd!r})")


class DifferentModelsError(ValueError):
    """The captures come from different checkpoints (their ``model_hash`` attrs differ)."""


def _check_same_model(sides: dict[str, xr.Dataset | None]) -> None:
    """Raise when two captures carry different checkpoint hashes. Only file hashes (64 hex
    digits) are compared: a parameter hash (``params:...``, models built in memory) changes
    with the dtype the same weights are held in, and ``unknown`` says nothing."""
    hashes = {k: str(ds.attrs.get("model_hash", "")) for k, ds in sides.items() if ds is not None}
    known = {k: h for k, h in hashes.items() if re.fullmatch(r"[0-9a-f]{64}", h)}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{k} {h[:12]}" for k, h in known.items())
        raise DifferentModelsError(
            f"the captures come from different models (model_hash {listed}): their activations are not "
            f"comparable. If that is intended (e.g. quantized vs original weights), pass "
            f"allow_different_models=True (mlab diff --allow-different-models)")


def load_capture(path: str | Path, stacklevel: int = 2) -> xr.Dataset:
    """A saved capture file as a Dataset (``Capture.load``: validates the format), lazily:
    its site values stay on disk until ``compare`` reads them tile by tile, so a capture
    larger than memory can be compared. Close it (``ds.close()``) when done.

    The loader's warnings (a partial capture, an unfinished journal beside the file) are
    passed on pointing at the code that asked for the file: ``stacklevel`` as for
    ``warnings.warn``, counted from here (2: the caller), so ``compare(path, ...)`` warns at
    the line calling ``compare``, not at a line of this module."""
    from aligntools.tracker.capture_dataset import Capture, CaptureFileError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = Capture.load(path, lazy=True).dataset
        except CaptureFileError:
            raise
        except (ValueError, TypeError) as e:  # an attr of the wrong type (complete=[1, 2, 3]): name the file
            raise CaptureFileError(f"cannot read capture {path}: {type(e).__name__}: {e}") from e
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=stacklevel)
    for v in ds.data_vars.values():  # so that a damaged tile read names its file (sweep._read)
        v.encoding.setdefault("source", str(path))
    return ds


def as_dataset(x: Any, stacklevel: int = 2) -> xr.Dataset:
    """Capture | Dataset | path -> Dataset (a path is loaded lazily: ``load_capture``, whose
    warnings point ``stacklevel`` frames up from here)."""
    if isinstance(x, (str, Path)):
        return load_capture(x, stacklevel=stacklevel + 1)
    ds = getattr(x, "dataset", x)
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"expected a Capture, xarray.Dataset or path, got {type(x).__name__}")
    return ds


def _open(x: Any, opened: ExitStack) -> xr.Dataset:
    """``as_dataset``, called from ``compare``: a loader's warning points at ``compare``'s
    caller; a dataset it opened from a path is closed when ``opened`` exits."""
    ds = as_dataset(x, stacklevel=4)  # as_dataset, _open, compare, its caller
    if isinstance(x, (str, Path)):
        opened.callback(ds.close)
    return ds


def _partial(ds: xr.Dataset) -> bool:
    """Whether a capture was saved by a run that stopped early (``complete`` attr 0)."""
    try:
        return int(ds.attrs.get("complete", 1)) == 0
    except (TypeError, ValueError):
        return False


def _site_vars(ds: xr.Dataset) -> list[str]:
    return [str(v) for v in ds.data_vars if ds[v].dims[:1] == ("token",)]


def _dtype(ds: xr.Dataset, site: str) -> str:
    """Precision that bounds a site's accuracy: the coarser of the site's own dtype and the
    run's (fp32 logprobs derived from bf16 logits carry bf16 error)."""
    return coarser(ds[site].attrs.get("dtype") or str(ds[site].dtype), ds.attrs.get("dtype"))


def _stats(v: xr.DataArray, idx: np.ndarray | None, max_memory: int | None) -> np.ndarray:
    """[N, len(STAT_NAMES)] stats of the aligned rows, from a stats-mode site or, with the
    Tracker's own ``row_stats`` (same formulas, same hash), from a tensor-mode one (read
    from disk in blocks within ``max_memory``: ``tiled_scan.disk_budget``)."""
    if "stat" in v.dims:
        s = v.sel(stat=list(STAT_NAMES)).values if "stat" in v.coords else v.values
        return s if idx is None else s[idx]
    blocks = Rows.of(v, idx).blocks(disk_budget(max_memory))
    return np.concatenate([row_stats(torch.from_numpy(np.ascontiguousarray(x))).numpy() for x in blocks])


def _site_list(sites: list[str], shown: int = 4) -> str:
    """``a, b`` or ``a, b, c, d, ... (40 sites)``: a note shared by every site stays one line."""
    more = f", ... ({len(sites)} sites)" if len(sites) > shown else ""
    return ", ".join(sites[:shown]) + more


def _hash_scheme(ds: xr.Dataset, v: xr.DataArray) -> str:
    """The row hash scheme of a site's ``hash`` stats: the capture's ``row_hash`` attr for a
    stats-mode site ("" when written before captures recorded it), this aligntools' own for a
    tensor-mode site (``_stats`` hashes its rows now)."""
    return str(ds.attrs.get("row_hash", "")) if "stat" in v.dims else row_hash.SCHEME


def _hash_note(scheme_a: str, scheme_b: str) -> str:
    """Why ``exact`` is unknown, or "" when both sides hashed their rows the same way."""
    if scheme_a == scheme_b:
        return ""
    named = [s or "unrecorded (an older aligntools)" for s in (scheme_a, scheme_b)]
    return (f"exact unknown: the captures hash their rows differently (a: {named[0]}, b: {named[1]}); "
            "the bounds still hold. For bit-equality, capture both sides with the same aligntools")


def _source(v: xr.DataArray, side: str) -> str:
    """The file a site's values come from (``load_capture`` records it), else the side's name."""
    return str(v.encoding.get("source") or side)


def _site_base(site: str, a: xr.Dataset, b: xr.Dataset) -> dict[str, str]:
    return {"site": site, "dtype_a": _dtype(a, site), "dtype_b": _dtype(b, site)}


def _small_site(site: str, a: xr.Dataset, b: xr.Dataset, al: Alignment,
                max_memory: int | None) -> SiteResult | None:
    """Result of a site that is not two float tensors (stats mode, integer ids, shapes that
    do not match): small or nothing to read. None for a tensor site (``_compare_sites``)."""
    va, vb = a[site], b[site]
    base = _site_base(site, a, b)
    unreal = [f"{_source(v, side)} holds {v.dtype} values, not real numbers" for side, v in (("a", va), ("b", vb))
              if not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer))]
    if unreal:  # strings, complex, booleans: no metric here means anything
        return SiteResult(basis="skipped", comparable=False, note="not comparable: " + "; ".join(unreal), **base)
    if "stat" in va.dims or "stat" in vb.dims:
        rows = stats_rows(_stats(va, al.idx_a, max_memory), _stats(vb, al.idx_b, max_memory))
        note = _hash_note(_hash_scheme(a, va), _hash_scheme(b, vb))
        if note:
            rows["exact"] = np.full_like(rows["exact"], np.nan)  # unknown, not "different"
        if S.parse(site).kind == "topk_ids":  # stats of expert ids: only equality means something
            return SiteResult(basis="ids", rows={"exact": rows["exact"]},
                              summary={"exact": float(rows["exact"].mean())}, note=note, **base)
        summary = stats_summary(rows)  # keeps missing_a/_b in rows where some row is missing
        summary.update(nan_rows(site, a, b, al, rows))
        return SiteResult(basis="stats", rows=rows, summary=summary, **_finite_somewhere(summary, note), **base)
    ints = [np.issubdtype(v.dtype, np.integer) for v in (va, vb)]
    if va.shape[1:] != vb.shape[1:] or ints[0] != ints[1]:
        return SiteResult(basis="skipped", comparable=False, note=f"not comparable: {va.dtype}{va.shape[1:]} vs "
                          f"{vb.dtype}{vb.shape[1:]}", **base)
    if 0 in va.shape[1:]:  # nothing per token: no metric is defined, and none can fail
        return SiteResult(basis="skipped", note=f"no values per token (shape {va.shape[1:]}): nothing to compare",
                          **base)
    if all(ints):
        xa, xb = va.values, vb.values
        rows = topk_rows(*(x if i is None else x[i] for x, i in ((xa, al.idx_a), (xb, al.idx_b))))
        return SiteResult(basis="ids", rows=rows, summary={k: float(v.mean()) for k, v in rows.items()}, **base)
    return None


def _tensor_result(site: str, a: xr.Dataset, b: xr.Dataset, al: Alignment,
                   out: dict[str, np.ndarray]) -> SiteResult:
    """Per-token and site metrics of a tensor site from its per-row sums ``out`` [N]: site
    sums are reductions of the full per-token arrays (``M.aggregate``)."""
    sums = {k: out[k] for k in M.ROW_SUMS}
    rows, summary = M.derive(sums), {k: float(v) for k, v in M.derive(M.aggregate(sums)).items()}
    summary["n_tokens"] = int(np.count_nonzero(sums["n_valid"]))
    summary.update(nan_rows(site, a, b, al, rows))
    if L.LOGIT_ROWS[0] in out:
        lr = L.mask_rows(out, valid=sums["n_valid"] > 0)
        rows.update(lr)
        summary.update(L.logit_summary(lr))
    return SiteResult(basis="tensor", rows=rows, summary=summary, **_finite_somewhere(summary, ""),
                      **_site_base(site, a, b))


def _finite_somewhere(summary: dict[str, float], note: str) -> dict:
    """``note`` and ``comparable`` of a measured site: not comparable when no token has a finite
    value on both sides (two all-NaN captures used to pass with no metric computed)."""
    if summary.get("n_tokens", 1) > 0:
        return {"note": note, "comparable": True}
    why = "no token has a finite value on both sides (all NaN or Inf): no metric could be computed"
    return {"note": "; ".join(n for n in (note, why) if n), "comparable": False}


def _compare_sites(sites: list[str], a: xr.Dataset, b: xr.Dataset, al: Alignment, next_ids: np.ndarray | None,
                   workers: int | None, max_memory: int | None, progress: bool | None) -> dict[str, SiteResult]:
    """Every site's result, in ``sites`` order. The tensor sites are measured in one sweep
    over both captures: one pass per site computing every metric, chunks in cache, tiles of
    all sites on ``workers`` threads, rows on disk read within ``max_memory``."""
    results = {s: _small_site(s, a, b, al, max_memory) for s in sites}
    if next_ids is not None and "logits" in results and results["logits"] is None:  # a tensor logits site
        _check_next_ids(next_ids, int(np.prod(a["logits"].shape[1:])), al)
    jobs = {s: M.site_job(Rows.of(a[s], al.idx_a), Rows.of(b[s], al.idx_b), next_ids if s == "logits" else None)
            for s, r in results.items() if r is None}
    M.run_jobs([job for job, _ in jobs.values()], workers, max_memory, progress)
    for s, (_, out) in jobs.items():
        results[s] = _tensor_result(s, a, b, al, out)
    return results


def _check_next_ids(next_ids: np.ndarray, width: int, al: Alignment) -> None:
    """Raise where a next-token id cannot index the logits row whose logprob it picks: the
    capture's ``token_id`` coordinate does not belong to its logits (another vocabulary)."""
    bad = np.flatnonzero(next_ids >= width)
    if len(bad):
        tok = al.tokens.iloc[bad[0]]
        raise ValueError(f"logits: token id {int(next_ids[bad[0]])} at request {int(tok['request'])}, position "
                         f"{int(tok['position']) + 1} is outside the logits width {width} ({len(bad)} such "
                         f"tokens): the captures' token_id coordinate does not index their logits. Fix the "
                         f"token ids, or leave logits out (sites=...)")


def _with_reference(results: dict[str, SiteResult], tol: Tolerance,
                    ref: Comparison) -> tuple[dict[str, SiteResult], Tolerance]:
    """``tol`` with the noise floors measured by ``ref`` (a's side against the reference run),
    and ``results`` with a note on each site whose measured floor is unusable.

    A floor that is not a finite number (NaN: the reference never emitted the site, e.g. the
    logits of a ``generate`` run; inf: the reference is all zero there) would make the limit
    NaN or inf, under which any error passes. Such a site keeps its dtype's default floor, as
    without a reference, and says so; ``Tolerance.with_noise_floor`` itself refuses them."""
    floors, bad = Tolerance.usable_floors({s: r.summary["rel_l2"] for s, r in ref.results.items()
                                           if r.basis in GATED_BASES})
    results = dict(results)
    for s, f in bad.items():
        why = (f"the reference gives no noise floor here (err(a vs reference) = {f}: the reference is "
               f"{'all NaN' if math.isnan(f) else 'all zero'} at this site), so the {results[s].dtype} "
               f"default floor applies")
        results[s] = replace(results[s], note="; ".join(n for n in (results[s].note, why) if n))
    return results, tol.with_noise_floor(floors)


def _check_threshold(threshold: object) -> None:
    """A growth factor that means something: a NaN made every jump test False (no first
    divergence, ever), and a factor at or below 1 calls a site whose error did not grow a jump."""
    ok = isinstance(threshold, numbers.Real) and not isinstance(threshold, (bool, np.bool_))
    if not ok or not math.isfinite(threshold) or threshold <= 1:
        raise ValueError(f"threshold must be a finite growth factor above 1 (a site diverges where its error "
                         f"exceeds threshold x its inputs' error; default {GROWTH_THRESHOLD}); got {threshold!r}")


def _check_labels(labels: object) -> None:
    """Two names, one per side (a one-name tuple failed with an IndexError in the report)."""
    if not (isinstance(labels, (tuple, list)) and len(labels) == 2 and all(isinstance(x, str) for x in labels)):
        raise ValueError(f"labels must be two strings, one per capture, e.g. ('hf', 'vllm'); got {labels!r}")


def compare(a: Any, b: Any, reference: Any = None, *, sites: str | list[str] | None = None,
            align: str = "strict", tolerance: Tolerance | str | Path | None = None,
            threshold: float = GROWTH_THRESHOLD, workers: int | None = None,
            labels: tuple[str, str] = ("a", "b"), allow_different_models: bool = False,
            max_memory: int | None = None, progress: bool | None = None) -> Comparison:
    """Measure capture ``b`` (side under test) against ``a`` (trusted side).

    reference: optional higher-precision run of ``a``'s side (e.g. the training engine in
    float64); its per-site error err(a vs reference) becomes the noise floor, so the limit
    of each site is ``k * err(a vs reference) + atol`` (``aligntools.analyzer.tolerance``). Without it
    the per-dtype default floors apply.
    sites: glob pattern(s) restricting the compared sites. align: token alignment mode
    (``aligntools.analyzer.token_align``). tolerance: a Tolerance or a JSON file path. threshold:
    growth factor for first divergence, finite and above 1. workers: threads for the metric
    kernels, a positive whole number (default: every core; the numbers do not depend on it).
    labels: the two sides' names in reports.
    allow_different_models: compare captures whose ``model_hash`` differs (e.g. quantized vs
    original weights); by default that raises ``DifferentModelsError``, since activations of
    two different models disagree for reasons no tolerance describes.
    max_memory: bytes of capture data ``compare`` may hold at once: a positive number (None:
    1 GiB; 0, negatives, NaN, inf, booleans and strings are a ``ValueError``). Paths
    (and lazily loaded captures) are never loaded whole: their rows are read from disk in
    tiles that fit half of it, the other half is headroom for the per-token results (~0.3 KB
    per token and site) and each thread's ~3 MiB of scratch. In-memory captures are read
    in place. progress: a tqdm bar on stderr over the bytes compared (default: shown when
    reading from disk to a terminal).
    """
    max_memory, workers = check_max_memory(max_memory), check_workers(workers)
    _check_threshold(threshold)
    _check_labels(labels)
    with ExitStack() as opened:
        ds_a, ds_b = _open(a, opened), _open(b, opened)
        ds_ref = None if reference is None else _open(reference, opened)
        if not allow_different_models:
            _check_same_model({labels[0]: ds_a, labels[1]: ds_b, "reference": ds_ref})
        tol = Tolerance.load(tolerance) if isinstance(tolerance, (str, Path)) else (tolerance or Tolerance())
        va, vb = _site_vars(ds_a), _site_vars(ds_b)
        if sites is not None and not [x for x in (sites.split(",") if isinstance(sites, str) else sites) if x.strip()]:
            raise ValueError(f"sites={sites!r} selects no site; give glob patterns such as 'logits' or "
                             f"'L*.resid_post', or None for every shared site")
        if sites is not None:
            chosen = S.select(sites, S.sort_sites(sorted(set(va) | set(vb))))
            va, vb = [s for s in va if s in chosen], [s for s in vb if s in chosen]
        common = S.sort_sites([s for s in va if s in set(vb)])
        if not common:
            raise ValueError(f"the captures share no site; a has {va[:6]}..., b has {vb[:6]}...")
        al = align_tokens(ds_a, ds_b, align)
        if len(al) == 0:
            raise ValueError(f"no token of a lines up with one of b (align={align!r})")
        next_ids = next_token_ids(ds_a, al) if "logits" in common else None
        results = _compare_sites(common, ds_a, ds_b, al, next_ids, workers, max_memory, progress)
        if ds_ref is not None:
            ref = compare(ds_ref, ds_a, sites=common, align=align, tolerance=tol, workers=workers,
                          allow_different_models=True, max_memory=max_memory, progress=progress)  # checked above
            results, tol = _with_reference(results, tol, ref)
        routing = routing_diff(ds_a, ds_b, al)
        partial = tuple(name for name, ds in ((labels[0], ds_a), (labels[1], ds_b), ("reference", ds_ref))
                        if ds is not None and _partial(ds))
    return Comparison(results=results, alignment=al, tolerance=tol, routing=routing,
                      only_a=tuple(s for s in S.sort_sites(va) if s not in results),
                      only_b=tuple(s for s in S.sort_sites(vb) if s not in results),
                      threshold=threshold, labels=labels, partial=partial)


def _fail_line(failures: list[str], shown: int = 8) -> str:
    """The verdict line: the first ``shown`` failing sites in execution order and how many more
    (a real model fails at hundreds of sites; the table above lists every one)."""
    more = len(failures) - shown
    return f"FAIL at {len(failures)} sites: {', '.join(failures[:shown])}" + (f", and {more} more" if more > 0 else "")
