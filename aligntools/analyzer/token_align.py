"""Line up the token rows of two captures before comparing them.

Why keys instead of row order: captures are flat over tokens, and two engines flatten
differently (a prefill capture lists a sequence at step 0; a decode capture lists the
prompt at step 0 and each generated token at its own step; batch layouts differ). A token
is identified by ``(request, position)`` - the same math happened there on both sides -
so rows are matched on that key, with the token id as the check that the inputs agree.

Modes:
- ``"strict"`` (default): both captures hold exactly the same (request, position) keys with
  the same token ids; anything else is a ``ValueError`` naming the first mismatch.
- ``"prefix"``: per request, compare the common tokens up to the first differing token id
  (after that the contexts differ, so errors would be meaningless).
- ``"sequence"``: requests are matched by their token-id sequence, not their index
  (different batch order on the two sides), then aligned strictly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr

from aligntools.sites import TOKEN_COORDS

MODES = ("strict", "prefix", "sequence")


@dataclass(frozen=True)
class Alignment:
    """Which rows of a and b are the same token.

    ``idx_a``/``idx_b``: [N] row indices into each capture's ``token`` dim (None = all rows
    in stored order, the zero-copy fast path). ``tokens``: [N] rows with columns request,
    position, token_id, step_a, step_b (request ids are a's).
    """

    idx_a: np.ndarray | None
    idx_b: np.ndarray | None
    tokens: pd.DataFrame
    mode: str
    dropped_a: int
    dropped_b: int

    def __len__(self) -> int:
        return len(self.tokens)


def token_table(ds: xr.Dataset) -> pd.DataFrame:
    """request/position/token_id/step per row; a dataset without token coords is one
    request at positions 0..N-1 with unknown ids (-1), so positional comparison still works."""
    n = ds.sizes.get("token", 0)
    cols = {}
    for name in TOKEN_COORDS:
        if name in ds.coords:
            cols[name] = _int_coord(ds, name)
        else:
            cols[name] = np.arange(n) if name == "position" else np.full(n, -1 if name == "token_id" else 0)
    return pd.DataFrame(cols)


def _int_coord(ds: xr.Dataset, name: str) -> np.ndarray:
    """Token coordinate ``name`` [N] as int64; floats holding whole numbers are accepted (a
    capture round-tripped through a tool that widened them). Anything else is refused by
    name: cast blindly, a NaN position became -2**63 and surfaced as a token "only in b", and a
    string request failed with numpy's "invalid literal for int()", naming neither."""
    v = np.asarray(ds.coords[name].values)
    if v.dtype.kind == "i":
        return v.astype(np.int64, copy=False)
    ok = None  # per row: a whole number int64 holds; None for other dtypes (strings, bools, ...)
    if v.dtype.kind == "u":
        ok = v <= np.iinfo(np.int64).max
    elif v.dtype.kind == "f":
        ok = np.isfinite(v) & (v == np.round(v)) & (np.abs(v) < 2.0 ** 63)
    if ok is not None and ok.all():
        return v.astype(np.int64)
    where = "" if ok is None else f" ({v[~ok][0].item()!r} at row {int(np.flatnonzero(~ok)[0])})"
    source = ds.encoding.get("source")
    raise ValueError(f"token coordinate {name!r}{f' of {source}' if source else ''} must hold integers, but it "
                     f"is {v.dtype}{where}: the capture's "
                     f"token coordinates are damaged or were written by another tool; set them to integers "
                     f"(ds.assign_coords({name}=(\"token\", ...))) or capture again")


def align(a: xr.Dataset, b: xr.Dataset, mode: str = "strict") -> Alignment:
    """Match token rows of ``a`` and ``b`` (see module doc for the modes)."""
    if mode not in MODES:
        raise ValueError(f"unknown align mode {mode!r}; choose one of {MODES}")
    ta, tb = token_table(a), token_table(b)
    if mode == "strict" and _same_layout(ta, tb):
        cols = {("step_a" if c == "step" else c): ta[c].to_numpy() for c in ta.columns}  # a's, step renamed
        tokens = pd.DataFrame(cols | {"step_b": tb["step"].to_numpy()})
        return Alignment(None, None, tokens, mode, 0, 0)
    if mode == "sequence":
        tb = tb.assign(request=_match_requests(ta, tb))
    key = _key(ta, tb)
    m = ta.reset_index(names="row").merge(
        tb.reset_index(names="row"), on=key, how="outer", suffixes=("_a", "_b"), indicator=True
    ).sort_values(key, kind="stable")
    if mode in ("strict", "sequence"):
        _raise_on_mismatch(m, key, len(ta), len(tb))
    else:
        m = _common_prefix(m)
    m = m.sort_values("row_a", kind="stable")
    tokens = pd.DataFrame({
        "request": m["request"].to_numpy(), "position": m["position"].to_numpy(),
        "token_id": m["token_id_a"].to_numpy(dtype=np.int64),
        "step_a": m["step_a" if "step_a" in m else "step"].to_numpy(dtype=np.int64),
        "step_b": m["step_b" if "step_b" in m else "step"].to_numpy(dtype=np.int64),
    })
    return Alignment(m["row_a"].to_numpy(np.int64), m["row_b"].to_numpy(np.int64), tokens, mode,
                     len(ta) - len(m), len(tb) - len(m))


def next_token_ids(ds: xr.Dataset, alignment: Alignment) -> np.ndarray:
    """[N] the token that follows each aligned row in ``ds`` (same request, position + 1),
    -1 where the capture does not contain it: the "given token" whose logprob we compare.
    Where ``ds`` holds a (request, position) more than once (decode steps), its first row's
    token counts.

    Why a sort and not a keyed lookup: this runs once per comparison of logits, serially
    before the threaded sweep, and pandas' MultiIndex reindex took ~5 ms at 4096 tokens
    (7% of a logits comparison). One stable sort of the capture's keys and the wanted keys
    together puts each wanted key right after the rows that hold it, first row first.
    """
    t = token_table(ds)
    have = t["request"].to_numpy(), t["position"].to_numpy(), t["token_id"].to_numpy()  # [n] each
    want_r = alignment.tokens["request"].to_numpy(np.int64)
    want_p = alignment.tokens["position"].to_numpy(np.int64) + 1
    n = len(have[0])
    r, p = np.concatenate([have[0], want_r]), np.concatenate([have[1], want_p])
    order = np.lexsort((np.arange(len(r)), p, r))  # by key; the capture's rows first, in row order
    rs, ps = r[order], p[order]
    new_key = np.ones(len(r), bool)
    new_key[1:] = (rs[1:] != rs[:-1]) | (ps[1:] != ps[:-1])
    first = order[np.maximum.accumulate(np.where(new_key, np.arange(len(r)), 0))]  # each key's first entry
    token = np.append(have[2], -1)[np.minimum(first, n)]  # [n + N]: -1 where no capture row has the key
    wanted = order >= n
    out = np.empty(len(want_r), np.int64)
    out[order[wanted] - n] = token[wanted]
    return out


def _same_layout(ta: pd.DataFrame, tb: pd.DataFrame) -> bool:
    """Whether both captures list the same tokens in the same row order (column by column:
    a frame's ``to_numpy`` of three columns copies them, 4x slower)."""
    return len(ta) == len(tb) and all(np.array_equal(ta[c].to_numpy(), tb[c].to_numpy())
                                      for c in ("request", "position", "token_id"))


def _key(ta: pd.DataFrame, tb: pd.DataFrame) -> list[str]:
    """(request, position), or with step added where a capture repeats a position
    (recompute-style decode); ambiguous rows are an error, not a silent pick."""
    for key in (["request", "position"], ["request", "position", "step"]):
        if not (ta.duplicated(key).any() or tb.duplicated(key).any()):
            return key
    raise ValueError("a capture holds the same (request, position, step) twice; cannot align it")


def _raise_on_mismatch(m: pd.DataFrame, key: list[str], n_a: int, n_b: int) -> None:
    hint = "pass align='prefix' to compare only the common tokens"
    only = m[m["_merge"] != "both"]
    if len(only):
        r = only.iloc[0]
        side = "a" if r["_merge"] == "left_only" else "b"
        where = ", ".join(f"{k}={int(r[k])}" for k in key)
        raise ValueError(f"captures hold different tokens (a: {n_a}, b: {n_b}); first mismatch: "
                         f"({where}) is only in {side}; {hint}")
    bad = m[m["token_id_a"] != m["token_id_b"]]
    if len(bad):
        r = bad.iloc[0]
        raise ValueError(f"token ids differ; first mismatch at request={int(r['request'])}, "
                         f"position={int(r['position'])}: id_a={int(r['token_id_a'])}, "
                         f"id_b={int(r['token_id_b'])}; {hint}")


def _common_prefix(m: pd.DataFrame) -> pd.DataFrame:
    """Rows present on both sides, per request before the first differing token id."""
    both = m[m["_merge"] == "both"]
    bad = both[both["token_id_a"] != both["token_id_b"]]
    cut = bad.groupby("request")["position"].min()
    limit = both["request"].map(cut).fillna(np.inf)
    return both[both["position"] < limit]


def _match_requests(ta: pd.DataFrame, tb: pd.DataFrame) -> np.ndarray:
    """b's request column relabelled with the a request whose token sequence is identical."""
    def seqs(t: pd.DataFrame) -> dict[int, tuple[int, ...]]:
        t = t.drop_duplicates(["request", "position"]).sort_values(["request", "position"])
        return {int(r): tuple(g["token_id"].tolist()) for r, g in t.groupby("request")}

    free: dict[tuple[int, ...], list[int]] = {}
    for r, s in seqs(ta).items():
        free.setdefault(s, []).append(r)
    mapping = {}
    for r, s in seqs(tb).items():
        if not free.get(s):
            raise ValueError(f"align='sequence': request {r} of b ({len(s)} tokens, starting "
                             f"{list(s[:5])}) matches no unmatched request of a")
        mapping[r] = free[s].pop(0)
    return tb["request"].map(mapping).to_numpy(np.int64)
