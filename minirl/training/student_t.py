"""Student-t quantiles, for the intervals of a handful of values (seeds of a run, readings of a monitor).

Why its own module: both the run plots (``minirl.training.plot``, a band over seeds) and the monitor's
sentence (``minirl.training.monitor_report``, a slope's interval) need it, and neither may import the
other's figures.
"""

from __future__ import annotations

import math

import numpy as np


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (no scipy here): bisection on the CDF, integrated by Simpson's rule."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float) -> float:
        grid = np.linspace(0.0, x, 4001)
        y = c * (1 + grid ** 2 / df) ** (-(df + 1) / 2)
        return 0.5 + (x / 12000) * float(y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2
