"""Tolerance policy: how much error a site may show before a comparison fails.

Why not a bare atol (docs/conventions.md): a bf16 engine is *expected* to be ~1e-2 off at
deep layers and an fp32 one ~1e-6; a fixed threshold is either flaky or blind. Like
PyTorch Dynamo's ``same()`` (torch/_dynamo/utils.py: passes when
``rmse(res, fp64_ref) <= multiplier * rmse(ref, fp64_ref) + tol / 10`` with ``multiplier``
2.0, or 3.0 for fp16/bf16 results and small tensors), the limit of a site is

    limit(site) = k * noise_floor(site) + atol

on the relative L2 error ``||b - a|| / ||a||`` (scale-free, so one atol serves embeddings
and logits alike). The noise floor is *measured* when a reference run exists (e.g. the
training side against a float64 run: ``Tolerance.from_noise_floor``); without one it is a
per-dtype default ``Rule.floor`` - a documented guess of how far two correct engines of
that dtype drift apart through a small model.

Overrides come from a JSON file (no YAML dependency)::

    {"default": {"k": 2.0, "atol": 1e-6},
     "dtypes":  {"bfloat16": {"floor": 0.02}},
     "sites":   {"L*.router_logits": {"k": 4.0}}}

Site patterns are globs; the most specific source wins: sites > default > dtypes.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Rule:
    """``k``: multiplier on the noise floor; ``atol``: relative-L2 slack that survives a
    zero floor; ``floor``: the noise floor used when none was measured."""

    k: float
    atol: float
    floor: float

    def limit(self, floor: float | None = None) -> float:
        return self.k * (self.floor if floor is None else floor) + self.atol


DTYPE_RULES: dict[str, Rule] = {
    # k follows Dynamo same(): 2 for fp32/fp64, 3 for half types.  atol ~ a quarter of a
    # unit roundoff for half types, well above fp32 roundoff (Dynamo uses tol/10 = 1e-5 RMSE).
    # floor: drift of two correct engines of that dtype. Measured on the 4-layer zoo models
    # (transformers sdpa vs eager attention, every site): fp32 max 3e-7, bf16 max 1.3e-2
    # (median 5e-3). fp32 keeps ~10x headroom for deeper/wider models; fp16 is scaled from
    # bf16 by the unit-roundoff ratio.
    "float64": Rule(k=2.0, atol=1e-12, floor=1e-13),
    "float32": Rule(k=2.0, atol=1e-6, floor=4e-6),
    "float16": Rule(k=3.0, atol=1e-4, floor=2e-3),
    "bfloat16": Rule(k=3.0, atol=1e-3, floor=1.6e-2),
}
_DTYPE_ALIASES = {"fp64": "float64", "double": "float64", "fp32": "float32", "float": "float32",
                  "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_PRECISION = ["float64", "float32", "float16", "bfloat16"]  # increasing unit roundoff


def canonical_dtype(name: str | None) -> str:
    """``"torch.bfloat16"``, ``"bf16"`` -> ``"bfloat16"``; unknown/None -> ``"float32"``."""
    if not name:
        return "float32"
    name = str(name).removeprefix("torch.").lower()
    name = _DTYPE_ALIASES.get(name, name)
    return name if name in DTYPE_RULES else "float32"


def coarser(d1: str | None, d2: str | None) -> str:
    """The less precise of two dtypes: the one whose noise sets the limit."""
    return max(canonical_dtype(d1), canonical_dtype(d2), key=_PRECISION.index)


@dataclass(frozen=True)
class Tolerance:
    """Per-site limits on relative L2 error. Immutable; ``with_*`` methods return copies.

    ``noise_floor`` maps site -> measured floor (from a reference run); sites missing from
    it fall back to the dtype's ``Rule.floor``.
    """

    dtypes: Mapping[str, Rule] = field(default_factory=lambda: dict(DTYPE_RULES))
    default: Mapping[str, float] = field(default_factory=dict)  # partial Rule fields
    sites: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # glob -> fields
    noise_floor: Mapping[str, float] = field(default_factory=dict)

    def rule(self, site: str, dtype: str | None = None) -> Rule:
        """The Rule for ``site`` computed in ``dtype``, after default and site overrides."""
        r = dataclasses.replace(self.dtypes[canonical_dtype(dtype)], **self.default)
        for pat, over in self.sites.items():
            if fnmatch.fnmatchcase(site, pat):
                r = dataclasses.replace(r, **over)
        return r

    def limit(self, site: str, dtype: str | None = None) -> float:
        """Largest relative L2 error ``site`` may show and still pass."""
        return self.rule(site, dtype).limit(self.noise_floor.get(site))

    @staticmethod
    def usable_floors(err_per_site: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """(the finite measured errors, the rest) of ``err_per_site``: a NaN floor (the
        reference never emitted a site) or an inf one (it is all zero there) would pass any
        error, so such sites keep their dtype's default floor (``compare(reference=...)`` and
        the alignment gate both measure floors and both drop these)."""
        usable = {s: e for s, e in err_per_site.items() if math.isfinite(e)}
        return usable, {s: e for s, e in err_per_site.items() if s not in usable}

    def with_noise_floor(self, err_per_site: Mapping[str, float]) -> Tolerance:
        """Copy whose floors are measured errors (e.g. err(training side vs float64)). Each
        must be a finite number >= 0, as in ``from_dict``: a NaN or inf floor makes the limit
        NaN or inf, under which every error passes (``compare(reference=...)`` keeps the
        dtype floor for such a site instead, and notes it)."""
        for site, err in err_per_site.items():
            if isinstance(err, bool) or not isinstance(err, numbers.Real) or not math.isfinite(err) or err < 0:
                raise ValueError(f"noise floor of {site}: {err!r} is not a finite number >= 0, so its limit would "
                                 f"pass any error; leave the site out to use its dtype's default floor")
        return dataclasses.replace(self, noise_floor={**self.noise_floor, **err_per_site})

    @classmethod
    def from_noise_floor(cls, err_per_site: Mapping[str, float], k: float | None = None,
                         atol: float | None = None) -> Tolerance:
        """Policy with measured floors; ``k``/``atol`` override the per-dtype values."""
        over = {n: v for n, v in (("k", k), ("atol", atol)) if v is not None}
        return cls(default=over).with_noise_floor(err_per_site)

    @classmethod
    def from_dict(cls, spec: Mapping) -> Tolerance:
        """Policy from the JSON layout in the module docstring. Checked whole before use:
        unknown keys or dtypes, non-numbers and negative values are ``ValueError``s naming
        the entry (a negative ``k`` or ``atol`` would fail identical captures)."""
        if not isinstance(spec, Mapping):
            raise ValueError(f"a tolerance spec is a JSON object with keys default, dtypes, sites; got "
                             f"{type(spec).__name__}")
        unknown = set(spec) - {"default", "dtypes", "sites"}
        if unknown:
            raise ValueError(f"unknown tolerance keys {sorted(unknown)}; use default, dtypes, sites")
        default = _rule_fields("default", spec.get("default", {}))
        dtypes = dict(DTYPE_RULES)
        for name, over in _section(spec, "dtypes").items():
            d = str(name).removeprefix("torch.").lower()
            d = _DTYPE_ALIASES.get(d, d)
            if d not in DTYPE_RULES:
                raise ValueError(f"tolerance dtypes: unknown dtype {name!r}; known: {', '.join(DTYPE_RULES)}")
            dtypes[d] = dataclasses.replace(dtypes[d], **_rule_fields(f"dtypes.{name}", over))
        sites = {str(pat): _rule_fields(f"sites.{pat}", over) for pat, over in _section(spec, "sites").items()}
        return cls(dtypes=dtypes, default=default, sites=sites)

    @classmethod
    def load(cls, path: str | Path) -> Tolerance:
        """Policy from a JSON file (see module docstring); errors name the file."""
        try:
            spec = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"tolerance file {path}: not JSON ({e})") from e
        try:
            return cls.from_dict(spec)
        except ValueError as e:
            raise ValueError(f"tolerance file {path}: {e}") from e


def _section(spec: Mapping, key: str) -> Mapping:
    part = spec.get(key, {})
    if not isinstance(part, Mapping):
        raise ValueError(f"tolerance {key!r} must be an object mapping names to rules; got {type(part).__name__}")
    return part


def _rule_fields(where: str, part: object) -> dict[str, float]:
    """Rule overrides: known fields only, each a finite number >= 0."""
    fields = [f.name for f in dataclasses.fields(Rule)]
    if not isinstance(part, Mapping):
        raise ValueError(f"tolerance entry {where} must be an object with keys among {fields}; got {part!r}")
    if set(part) - set(fields):
        raise ValueError(f"tolerance entry {where} {dict(part)} has keys outside {fields}")
    for key, value in part.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"tolerance entry {where}: {key} must be a number; got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"tolerance entry {where}: {key} must be finite and >= 0; got {value!r} "
                             f"(a negative limit fails even identical captures)")
    return {k: float(v) for k, v in part.items()}
