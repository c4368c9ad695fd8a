"""Audit a run's rollout records: name why the engine's logprobs differ from the trainer's.

``aligntools.audit(records, model)`` returns an ``AuditResult`` (``.verdict``, ``.causes``); the
package is callable so that ``aligntools.audit`` is both the function and the home of its parts
(``aligntools.audit.CAUSES``, ``register_cause``). Semantic causes are tested first, each by its
signature (docs/audit.md); ``numeric`` is what they leave, ``routing`` what replaying the recorded
experts removes, ``quantized_layers`` what re-scoring with quantized layers removes;
``aligntools.audit.fingerprint(records, model)`` (``aligntools.audit.precision``) ranks the precision
choices that reproduce a numeric gap token by token, and ``aligntools.audit.by_size`` those whose gap is as
large where none does (an engine rounding in its own order on a deep model). Importing this package loads
no model code: transformers is imported on first audit.
"""

from __future__ import annotations

import sys
import types

from aligntools.audit.registry import ACCEPT, CAUSES, Fit, register_cause
from aligntools.audit.result import AuditResult, Cause
from aligntools.audit.run import audit
from aligntools.audit.precision import fingerprint


class _CallableModule(types.ModuleType):
    """``aligntools.audit(...)`` calls ``audit``: the package name and the function name are one."""

    def __call__(self, *args: object, **kwargs: object) -> AuditResult:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["ACCEPT", "CAUSES", "AuditResult", "Cause", "Fit", "audit", "fingerprint", "register_cause"]
