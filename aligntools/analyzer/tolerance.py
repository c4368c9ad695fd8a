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

    def with_noise_floor(self, err_per_site: Mapping[str, float]) -> Tolerance:
        """Copy whose floors are measured errors (e.g. err(training side vs float64))."""
        return dataclasses.replace(self, noise_floor={**self.noise_floor, **err_per_site})

    @classmethod
    def from_noise_floor(cls, err_per_site: Mapping[str, float], k: float | None = None,
                         atol: float | None = None) -> Tolerance:
        """Policy with measured floors; ``k``/``atol`` override the per-dtype values."""
        over = {n: v for n, v in (("k", k), ("atol", atol)) if v is not None}
        return cls(default=over).with_noise_floor(err_per_site)

    @classmethod
    def from_dict(cls, spec: Mapping) -> Tolerance:
        """Policy from the JSON layout in the module docstring (unknown keys are errors)."""
        unknown = set(spec) - {"default", "dtypes", "sites"}
        if unknown:
            raise ValueError(f"unknown tolerance keys {sorted(unknown)}; use default, dtypes, sites")
        fields = {f.name for f in dataclasses.fields(Rule)}
        for part in [spec.get("default", {}), *spec.get("dtypes", {}).values(), *spec.get("sites", {}).values()]:
            if set(part) - fields:
                raise ValueError(f"tolerance entry {dict(part)} has keys outside {sorted(fields)}")
        dtypes = dict(DTYPE_RULES)
        for name, over in spec.get("dtypes", {}).items():
            d = canonical_dtype(name)
            dtypes[d] = dataclasses.replace(dtypes[d], **over)
        return cls(dtypes=dtypes, default=dict(spec.get("default", {})), sites=dict(spec.get("sites", {})))

    @classmethod
    def load(cls, path: str | Path) -> Tolerance:
        """Policy from a JSON file (see module docstring)."""
        return cls.from_dict(json.loads(Path(path).read_text()))
