"""Sentences computed from the values they describe, so a notebook's prose cannot contradict its output.

Why a module: a hand-written "took 0.79x less time" next to a table showing more time, or "grows" over
a flat curve, is what an attendee reads first. Each function here takes the measured numbers and
returns the words, choosing the direction ("less"/"more", "grows"/"flat") and saying when a
difference is inside run-to-run noise, with the measured spread. Pure functions: unit-tested on both
sides of every threshold (tests/labs/test_narrate.py), asserted against each notebook's own outputs
(tests/labs/test_notebook_outputs.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Literal

NOISE_SIGMAS = 2.0
"""A difference counts only beyond this many standard errors (about 95 % for a normal mean)."""
FOLD_THRESHOLD = 1.5
"""A quantity "grows" / "falls" when it changes by more than this factor and beyond noise."""
REMOVES_THRESHOLD = 10.0
"""A fix "removes" a gap when it shrinks it at least this many times (CompassMax's ~10x)."""
SAME_THRESHOLD = 1.1
"""Ratios within [1/1.1, 1.1] are "unchanged"."""
SAME_ORDER = 3.0
"""Two values are "of the same order" within this factor of each other."""

Direction = Literal["less", "more", "noise"]


def _check_samples(name: str, values: Sequence[float]) -> list[float]:
    vals = [float(v) for v in values]
    if not vals or not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{name} must be a non-empty sequence of finite numbers, got {values!r}; "
                         "pass the per-step measurements")
    return vals


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean (0 with one sample: its noise is not measured)."""
    vals = _check_samples("values", values)
    return statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0


def direction(candidate: Sequence[float], baseline: Sequence[float]) -> Direction:
    """"less" / "more" when the candidate's mean is below / above the baseline's by more than
    ``NOISE_SIGMAS`` standard errors of the difference, else "noise"."""
    c, b = _check_samples("candidate", candidate), _check_samples("baseline", baseline)
    diff = statistics.mean(c) - statistics.mean(b)
    se = math.hypot(standard_error(c), standard_error(b))
    if abs(diff) <= NOISE_SIGMAS * se or diff == 0:
        return "noise"
    return "less" if diff < 0 else "more"


def _spread(values: Sequence[float], unit: str) -> str:
    vals = list(values)
    if len(vals) == 1:
        return f"{vals[0]:.2f} {unit} (one step)"
    return f"{statistics.mean(vals):.2f} {unit} (steps ranged {min(vals):.2f}-{max(vals):.2f} {unit})"


def compare_times(candidate_name: str, candidate: Sequence[float], baseline_name: str,
                  baseline: Sequence[float], what: str = "per step", unit: str = "s") -> str:
    """"C3PO++ took 9.27 s per step (steps ranged …) against 7.31 s (…) for synchronous: 1.27x more
    time, a difference inside run-to-run noise." The direction and the noise verdict come from
    ``direction``; the ratio is always >= 1 so "0.79x less" cannot be written."""
    c, b = _check_samples(candidate_name, candidate), _check_samples(baseline_name, baseline)
    mc, mb = statistics.mean(c), statistics.mean(b)
    verdict = direction(c, b)
    head = (f"{candidate_name} took {_spread(c, unit)} {what} against {_spread(b, unit)} for {baseline_name}")
    fold = max(mc, mb) / min(mc, mb) if min(mc, mb) > 0 else math.inf
    more_or_less = "less" if mc < mb else "more"
    if verdict == "noise":
        se = math.hypot(standard_error(c), standard_error(b))
        noise = (f"inside run-to-run noise (difference {abs(mc - mb):.2f} {unit}, "
                 f"{NOISE_SIGMAS:g} standard errors = {NOISE_SIGMAS * se:.2f} {unit})" if se > 0 else
                 "not resolved: with one timed step per arm the run-to-run noise is unmeasured")
        return f"{head}: {fold:.2f}x {more_or_less} time, a difference {noise}"
    return f"{head}: **{fold:.2f}x {verdict} time**, beyond run-to-run noise"


def speedup_vs_paper(verdict: Direction, speedup: float, paper: float) -> str:
    """One clause comparing a measured speedup (baseline / candidate time) with the paper's,
    consistent with ``direction``'s verdict on the candidate's time."""
    if verdict == "noise":
        return f"no speedup resolved ({speedup:.2f}x, inside the noise; the paper reports ~{paper:g}x)"
    if verdict == "more":
        return f"slower ({speedup:.2f}x), where the paper reports ~{paper:g}x faster"
    if speedup >= paper / SAME_THRESHOLD:
        return f"faster ({speedup:.2f}x), as much as the paper's ~{paper:g}x"
    return f"faster ({speedup:.2f}x), but by less than the paper's ~{paper:g}x"


def reproduces(verdict: Direction, speedup: float, paper: float) -> bool:
    """True when the candidate is resolved as faster by at least the paper's factor (within 10 %)."""
    return verdict == "less" and speedup >= paper / SAME_THRESHOLD


def trend(first: float, last: float, noise: float = 0.0, unit: str = "") -> str:
    """"grows from a to b" / "falls from a to b" when ``last`` differs from ``first`` by more than
    ``FOLD_THRESHOLD`` times and by more than ``noise`` (an absolute spread); else "stays flat"."""
    if not (math.isfinite(first) and math.isfinite(last)) or noise < 0:
        raise ValueError(f"trend needs finite first/last and noise >= 0, got {first!r}, {last!r}, {noise!r}")
    lo, hi = sorted((abs(first), abs(last)))
    folded = hi > FOLD_THRESHOLD * lo
    if folded and abs(last - first) > noise:
        return f"{'grows' if last > first else 'falls'} from {first:.3g}{unit} to {last:.3g}{unit}"
    why = f", inside the noise of ±{noise:.2g}{unit}" if folded else ""
    return f"stays flat ({first:.3g}{unit} to {last:.3g}{unit}{why})"


def share_noise(permille: float, tokens: int) -> float:
    """Binomial standard error of a per-mille share measured on ``tokens`` tokens, times ``NOISE_SIGMAS``."""
    if tokens <= 0 or not 0 <= permille <= 1000:
        raise ValueError(f"share_noise needs tokens > 0 and 0 <= permille <= 1000, got {tokens!r}, {permille!r}")
    p = permille / 1000
    return NOISE_SIGMAS * 1000 * math.sqrt(p * (1 - p) / tokens)


def reduction(before: float, after: float, what: str = "the gap") -> str:
    """"removes {what}" (>= ``REMOVES_THRESHOLD`` x smaller), "cuts {what} Nx", "leaves {what}
    unchanged" (within ``SAME_THRESHOLD``) or "makes {what} larger"."""
    if before < 0 or after < 0:
        raise ValueError(f"reduction needs non-negative errors, got before={before!r}, after={after!r}")
    if after == 0:
        return f"removes {what} entirely" if before > 0 else f"leaves {what} at 0"
    fold = before / after
    if fold >= REMOVES_THRESHOLD:
        return f"removes {what} ({fold:.0f}x smaller)"
    if fold > SAME_THRESHOLD:
        return f"cuts {what} {fold:.1f}x, short of removing it"
    if fold >= 1 / SAME_THRESHOLD:
        return f"leaves {what} unchanged ({fold:.2f}x)"
    return f"makes {what} larger ({1 / fold:.1f}x)"


def magnitude(a: float, b: float, a_name: str, b_name: str) -> str:
    """"of the same order as" within ``SAME_ORDER``, else "Nx smaller/larger than"."""
    if a <= 0 or b <= 0:
        return f"{a_name} is {a:.2g} against {b:.2g} for {b_name}"
    fold = a / b
    if 1 / SAME_ORDER <= fold <= SAME_ORDER:
        return f"{a_name} ({a:.2g}) is of the same order as {b_name} ({b:.2g})"
    return (f"{a_name} ({a:.2g}) is {fold:.0f}x larger than {b_name} ({b:.2g})" if fold > 1 else
            f"{a_name} ({a:.2g}) is {1 / fold:.0f}x smaller than {b_name} ({b:.2g})")


def peaks(metric: str, values: Mapping[str, float]) -> str:
    """"GRPO's grad norm peaks at 8.2, TIS's at 3.1 and IcePop's at 1.7 (GRPO's is 4.8x IcePop's)":
    named numbers, largest first, never a raw dict."""
    if not values:
        raise ValueError(f"peaks needs at least one arm for {metric!r}")
    order = sorted(values.items(), key=lambda kv: kv[1], reverse=True)
    (top, vmax), (low, vmin) = order[0], order[-1]
    parts = [f"{top}'s {metric} peaks at {vmax:.3g}"] + [f"{name}'s at {v:.3g}" for name, v in order[1:]]
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    if len(order) > 1 and vmin > 0:
        body += f" ({top}'s is {vmax / vmin:.1f}x {low}'s)"
    return body


def proportion_difference(a_name: str, a: float, b_name: str, b: float, n: int, what: str = "reward") -> str:
    """Two mean rewards (in [0, 1]) over ``n`` rollouts each: "higher/lower by d" beyond a
    binomial ``NOISE_SIGMAS`` spread, else "within sampling noise (±s)"."""
    if n <= 0 or not (0 <= a <= 1 and 0 <= b <= 1):
        raise ValueError(f"proportion_difference needs n > 0 and rewards in [0, 1], got n={n}, {a}, {b}")
    noise = NOISE_SIGMAS * math.sqrt((a * (1 - a) + b * (1 - b)) / n)
    if abs(a - b) <= noise:
        return (f"{a_name}'s {what} {a:.2f} and {b_name}'s {b:.2f} are within sampling noise "
                f"(±{noise:.2f} over {n} rollouts each)")
    return (f"{a_name}'s {what} ({a:.2f}) is {'higher' if a > b else 'lower'} than {b_name}'s ({b:.2f}) "
            f"by {abs(a - b):.2f}, beyond sampling noise (±{noise:.2f} over {n} rollouts each)")


def count_sentence(n: int, total: int, where: str, otherwise: str) -> str:
    """"{n} of {total} {where}" when n > 0, else ``otherwise``: a "some …" claim only when some are."""
    return f"{n} of {total} {where}" if n > 0 else otherwise


def ratio_model(predicted: float, measured: float, noise: float) -> Literal["below", "above", "matches"]:
    """Where a measured ratio sits against a model's prediction, given the measurement's noise."""
    if abs(measured - predicted) <= noise:
        return "matches"
    return "below" if measured < predicted else "above"


def ratio_noise(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """``NOISE_SIGMAS`` standard errors of mean(numerator) / mean(denominator) (first-order)."""
    n, d = _check_samples("numerator", numerator), _check_samples("denominator", denominator)
    mn, md = statistics.mean(n), statistics.mean(d)
    rel = math.hypot(standard_error(n) / mn, standard_error(d) / md)
    return NOISE_SIGMAS * rel * mn / md


def stand_out(ratio: float, n_tokens: int) -> str:
    """Whether flipped tokens are visible in a token x layer heatmap: their error after the flip
    over the other tokens' median at the same layers (``ratio``) beyond ``FOLD_THRESHOLD``."""
    if n_tokens == 0:
        return "no token flipped, so no row of the heatmap is a routing flip"
    if ratio >= FOLD_THRESHOLD:
        return (f"the {n_tokens} flipped tokens show up as bright rows from their first flipped layer on "
                f"(median {ratio:.1f}x the other tokens' error at the same layers)")
    return (f"the {n_tokens} flipped tokens do not stand out in the heatmap (median {ratio:.2f}x the other tokens' "
            "error at the same layers): here a flip costs no more than the bf16 arithmetic around it")
