"""What ``aligntools.drill`` returns: the op table and the op it names."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from aligntools.drilldown.pairing import OpDivergence


@dataclass
class DrillResult:
    """``table``: one row per op in execution order (``pairing.COLUMNS``): the op (its family,
    ``gemm``/``softmax``/``sdpa``, else the aten name: ``mul``), its role, token-major output
    shape and dtype (``bfloat16->float32`` = reads bf16, writes fp32) on each side (empty =
    not run there: unpaired), error (relative L2, train vs infer), input_error, growth, limit,
    jumps and the minirl knob that sets it. ``first``: the first op whose error jumps beyond
    its inputs' (None: none does). ``input_error``: the module input's error."""

    site: str
    train: str
    infer: str
    table: pd.DataFrame
    first: OpDivergence | None
    input_error: float

    @property
    def unpaired(self) -> pd.DataFrame:
        """Ops that ran on one side only (a fused op, another decomposition): not compared."""
        t = self.table
        return t[(t["shape_train"] == "") | (t["shape_infer"] == "")]

    def __str__(self) -> str:
        t = self.table.copy()
        t["jumps"] = t["jumps"].map({True: "<-", False: ""})
        body = t.to_string(float_format=lambda v: f"{v:.3g}", na_rep="")
        verdict = str(self.first) if self.first else "no op jumps above its inputs' error"
        return (f"drill-down of {self.site}: {self.infer} vs {self.train} (module input error "
                f"{self.input_error:.3g}; {len(self.unpaired)} of {len(t)} ops unpaired, not compared)\n"
                f"{body}\n{verdict}")
