"""Engine specs on the command line (``hf``, ``hf:bfloat16``, ``minirl:aligned,rmsnorm=fused_add``,
``vllm:bfloat16,max_model_len=256``): the names ``mlab capture`` / ``mlab check`` and earlier
releases use, kept as thin names over the one grammar and the one builder.

The grammar, its valid values and the default dtypes are ``minirl.EngineSpec`` (docs/engine.md);
engines are built by ``aligntools.adapters.build.build_engine``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aligntools.adapters.build import build_engine as load_target
from aligntools.adapters.build import load_hf

if TYPE_CHECKING:
    from minirl import EngineSpec

__all__ = ["load_hf", "load_target", "parse_engine_spec"]


def parse_engine_spec(spec: str) -> EngineSpec:
    """``"minirl:aligned,rmsnorm=fused_add"`` -> ``EngineSpec("minirl", None, "aligned", {"rmsnorm":
    "fused_add"})``; a ValueError names the bad part and lists the valid values."""
    from minirl import EngineSpec

    return EngineSpec.parse(spec)
