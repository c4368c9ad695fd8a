"""Drill-down: from a divergent site to the first tensor op inside its module that diverges."""

from aligntools.drilldown.api import drill
from aligntools.drilldown.pairing import OpDivergence
from aligntools.drilldown.result import DrillResult

__all__ = ["DrillResult", "OpDivergence", "drill"]
