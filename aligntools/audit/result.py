"""What an audit returns: the verdict and the causes, ordered by their share of the gap."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cause:
    """One cause: ``name`` (docs/audit.md), ``estimate`` (T, p, k, a checkpoint, nats for ``numeric``,
    the share of tokens with a flip for ``routing``), ``share`` of the trainer-engine gap it removes,
    ``parameter`` (what the estimate is), ``fix``, ``detail`` (cause-specific numbers)."""

    name: str
    estimate: float | int | str
    share: float
    parameter: str
    fix: str
    detail: dict = field(default_factory=dict)

    def line(self) -> str:
        estimate = f"{self.estimate:.4g}" if isinstance(self.estimate, float) else str(self.estimate)
        return f"{self.name} ({self.parameter} {estimate}): {self.share:.1%} of the gap; fix: {self.fix}"


@dataclass(frozen=True)
class AuditResult:
    """``verdict``: "aligned" (gap within the noise floor's limit) or "misaligned"; ``causes`` by share;
    ``gap``: mean |engine - trainer logprob| in nats before any cause is applied; ``floor``, ``limit``
    in nats; ``tokens``, ``records`` audited; ``routing``: flip statistics when the records carry experts."""

    verdict: str
    causes: tuple[Cause, ...]
    gap: float
    floor: float
    limit: float
    tokens: int
    records: int
    routing: dict | None = None

    def summary(self) -> str:
        """The verdict line (the biggest cause first, with its estimate and share), then one line per cause."""
        size = (f"mean |engine - trainer logprob| {self.gap:.3g} nats over {self.tokens} tokens of {self.records} "
                f"records (limit {self.limit:.2g} from the float64 noise floor {self.floor:.2g})")
        if self.verdict == "aligned":
            return f"aligned: {size}"
        top = self.causes[0]
        lines = [f"misaligned: {top.name} ({top.parameter} {_fmt(top.estimate)}) explains {top.share:.1%} of the gap; {size}"]
        return "\n".join(lines + [f"  {c.line()}{_fingerprint(c.detail)}" for c in self.causes])

    def to_json(self) -> dict:
        """``{"verdict", "causes": [{"name", "estimate", "share"}, ...]}`` plus the sizes and each cause's fix."""
        return {"verdict": self.verdict,
                "causes": [{"name": c.name, "estimate": c.estimate, "share": c.share, "parameter": c.parameter,
                            "fix": c.fix, "detail": c.detail} for c in self.causes],
                "gap": self.gap, "floor": self.floor, "limit": self.limit, "tokens": self.tokens,
                "records": self.records, "routing": self.routing}


def _fingerprint(detail: dict) -> str:
    """``numeric``'s fingerprint and replay as one clause: the candidate that reproduces the engine token by
    token, else the by-size reading ("" when neither ran)."""
    from aligntools.audit.by_size import REPRODUCES, sentence

    ranked, sized = detail.get("fingerprint") or [], detail.get("by_size")
    replayed = detail.get("replay") or {}
    site = (f"; replayed through minirl as {replayed['candidate']}, the first divergent site is "
            f"{replayed['first_divergence']}" if replayed.get("first_divergence") else "")
    if ranked and ranked[0][1] >= REPRODUCES:
        name, share = ranked[0]
        return f"\n    fingerprint: {name} explains {share:.0%} of this gap{site}"
    if sized is None:
        return ""
    name, share = ranked[0] if ranked else ("none", 0.0)
    return (f"\n    fingerprint: no precision choice reproduces these logprobs token by token (the closest, {name}, "
            f"removes {share:.0%}); {sentence(sized)}{site}")


def _fmt(value: float | int | str) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
