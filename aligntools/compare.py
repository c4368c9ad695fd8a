"""``compare(a, b, reference=None)``: measure capture ``b`` against capture ``a``.

Works on anything in the Capture dataset format (docs/architecture.md): an
``aligntools.Capture`` (anything with a ``.dataset``), a raw ``xarray.Dataset`` or a path to
a saved capture. Bad input degrades to findings rather than crashes: disjoint site sets are
intersected (the rest listed), NaN/Inf are counted, stats-mode and tensor-mode sites are
compared on the stats both have, mismatched trailing shapes are skipped with a note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from aligntools import metrics as M
from aligntools import sites as S
from aligntools.comparison import GATED_BASES, Comparison, SiteResult
from aligntools.divergence import GROWTH_THRESHOLD
from aligntools.routing_diff import routing_diff
from aligntools.stats import STAT_NAMES, row_stats
from aligntools.token_align import Alignment, align as align_tokens, next_token_ids
from aligntools.tolerance import Tolerance, coarser


def load_capture(path: str | Path) -> xr.Dataset:
    """A saved capture file as a Dataset (``Capture.load``: validates the format)."""
    from aligntools.capture import Capture

    return Capture.load(path).dataset


def as_dataset(x: Any) -> xr.Dataset:
    """Capture | Dataset | path -> Dataset."""
    if isinstance(x, (str, Path)):
        return load_capture(x)
    ds = getattr(x, "dataset", x)
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"expected a Capture, xarray.Dataset or path, got {type(x).__name__}")
    return ds


def _site_vars(ds: xr.Dataset) -> list[str]:
    return [str(v) for v in ds.data_vars if ds[v].dims[:1] == ("token",)]


def _dtype(ds: xr.Dataset, site: str) -> str:
    """Precision that bounds a site's accuracy: the coarser of the site's own dtype and the
    run's (fp32 logprobs derived from bf16 logits carry bf16 error)."""
    return coarser(ds[site].attrs.get("dtype") or str(ds[site].dtype), ds.attrs.get("dtype"))


def _stats(v: xr.DataArray, idx: np.ndarray | None) -> np.ndarray:
    """[N, len(STAT_NAMES)] stats of the aligned rows, from a stats-mode site or, with the
    Tracker's own ``row_stats`` (same formulas, same hash), from a tensor-mode one."""
    if "stat" in v.dims:
        s = v.sel(stat=list(STAT_NAMES)).values if "stat" in v.coords else v.values
        return s if idx is None else s[idx]
    x = v.values
    return row_stats(torch.from_numpy(np.ascontiguousarray(x if idx is None else x[idx]))).numpy()


def _compare_site(site: str, a: xr.Dataset, b: xr.Dataset, al: Alignment,
                  next_ids: np.ndarray | None, workers: int | None) -> SiteResult:
    va, vb = a[site], b[site]
    base = {"site": site, "dtype_a": _dtype(a, site), "dtype_b": _dtype(b, site)}
    if "stat" in va.dims or "stat" in vb.dims:
        rows = M.stats_rows(_stats(va, al.idx_a), _stats(vb, al.idx_b))
        if S.parse(site).kind == "topk_ids":  # stats of expert ids: only equality means something
            return SiteResult(basis="ids", rows={"exact": rows["exact"]},
                              summary={"exact": float(rows["exact"].mean())}, **base)
        summary = M.stats_summary(rows)
        return SiteResult(basis="stats", rows=rows, summary=summary, **base)
    ints = [np.issubdtype(v.dtype, np.integer) for v in (va, vb)]
    if va.shape[1:] != vb.shape[1:] or ints[0] != ints[1]:
        return SiteResult(basis="skipped", note=f"not comparable: {va.dtype}{va.shape[1:]} vs "
                          f"{vb.dtype}{vb.shape[1:]}", **base)
    xa, xb = va.values, vb.values
    if all(ints):
        rows = M.topk_rows(*(x if i is None else x[i] for x, i in ((xa, al.idx_a), (xb, al.idx_b))))
        return SiteResult(basis="ids", rows=rows, summary={k: float(v.mean()) for k, v in rows.items()}, **base)
    sums = M.row_sums(xa, xb, al.idx_a, al.idx_b, workers=workers)
    rows, summary = M.derive(sums), {k: float(v) for k, v in M.derive(M.aggregate(sums)).items()}
    summary["n_tokens"] = int(np.count_nonzero(sums["n_valid"]))
    if site == "logits" and next_ids is not None:
        lr = M.logit_rows(xa, xb, next_ids, al.idx_a, al.idx_b, valid=sums["n_valid"] > 0)
        rows.update(lr)
        summary.update(M.logit_summary(lr))
    return SiteResult(basis="tensor", rows=rows, summary=summary, **base)


def compare(a: Any, b: Any, reference: Any = None, *, sites: str | list[str] | None = None,
            align: str = "strict", tolerance: Tolerance | str | Path | None = None,
            threshold: float = GROWTH_THRESHOLD, workers: int | None = None,
            labels: tuple[str, str] = ("a", "b")) -> Comparison:
    """Measure capture ``b`` (side under test) against ``a`` (trusted side).

    reference: optional higher-precision run of ``a``'s side (e.g. the training engine in
    float64); its per-site error err(a vs reference) becomes the noise floor, so the limit
    of each site is ``k * err(a vs reference) + atol`` (``aligntools.tolerance``). Without it
    the per-dtype default floors apply.
    sites: glob pattern(s) restricting the compared sites. align: token alignment mode
    (``aligntools.token_align``). tolerance: a Tolerance or a JSON file path. threshold:
    growth factor for first divergence. workers: threads for the metric kernels.
    """
    ds_a, ds_b = as_dataset(a), as_dataset(b)
    tol = Tolerance.load(tolerance) if isinstance(tolerance, (str, Path)) else (tolerance or Tolerance())
    va, vb = _site_vars(ds_a), _site_vars(ds_b)
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
    results = {s: _compare_site(s, ds_a, ds_b, al, next_ids, workers) for s in common}
    if reference is not None:
        ref = compare(reference, ds_a, sites=common, align=align, tolerance=tol, workers=workers)
        tol = tol.with_noise_floor({s: r.summary["rel_l2"] for s, r in ref.results.items()
                                    if r.basis in GATED_BASES})
    return Comparison(results=results, alignment=al, tolerance=tol, routing=routing_diff(ds_a, ds_b, al),
                      only_a=tuple(s for s in S.sort_sites(va) if s not in results),
                      only_b=tuple(s for s in S.sort_sites(vb) if s not in results),
                      threshold=threshold, labels=labels)
