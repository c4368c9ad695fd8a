"""Three inference engines side by side against one fp32 trainer: real vLLM (CPU build), real
SGLang (CPU, docs/sglang.md) and minirl's ``typical`` preset, each in bf16, on the same tokens.

Why one function: a user choosing an engine wants one table: per site how far each engine is from
the trainer, where each first diverges, and which minirl knobs reproduce each engine's numerics
(``aligntools.fingerprint``), so "SGLang rounds like X, vLLM like Y" is a measured statement. The
trainer and its float64 reference are captured once; each engine's error is judged against the
trainer's own float32-vs-float64 error (the gate's noise floor).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import pandas as pd
import torch
from matplotlib.figure import Figure

ENGINES = ("vllm:bfloat16", "sglang:bfloat16", "minirl:typical")


@dataclass
class ThreeEngines:
    """``sites``: site x engine rel-L2 vs the fp32 trainer (execution order). ``summary``: per
    engine its first divergence, mean |Δ logprob|, fingerprint distance, the knobs the fingerprint
    finds (those differing from ``hf_exact``) and where the gap no knob explains starts."""

    sites: pd.DataFrame
    summary: pd.DataFrame


def three_engines(path: str | os.PathLike, tokens: int = 256, engines: tuple[str, ...] = ENGINES,
                  passes: int = 2) -> ThreeEngines:
    """Capture the trainer (hf float32) and each engine of ``engines`` on ``tokens`` built-in
    tokens of checkpoint ``path``; compare and fingerprint each."""
    import aligntools
    from aligntools.analyzer.tolerance import Tolerance
    from aligntools.gates.inputs import prepare_tokens
    from minirl.engines import build_engine, load_hf

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vLLM's import: its INFO start-up lines
    ids = prepare_tokens(path, tokens)
    train = aligntools.capture(load_hf(path, "float32"), ids, progress=False)
    ref = aligntools.capture(load_hf(path, "float64"), ids, progress=False)
    floor = aligntools.compare(ref, train)
    floors, _ = Tolerance.usable_floors({s: r.summary["rel_l2"] for s, r in floor.results.items()
                                         if "rel_l2" in r.summary})
    tolerance = Tolerance().with_noise_floor(floors)
    columns, rows = {}, []
    for spec in engines:
        engine = build_engine(spec, path)
        cap = aligntools.capture(engine, ids, progress=False)
        del engine
        gc.collect()
        cmp = aligntools.compare(train, cap, tolerance=tolerance)
        columns[spec] = cmp.table["rel_l2"]
        fp = aligntools.fingerprint(cap, path, passes=passes)
        div = cmp.first_divergence
        knobs = ", ".join(f"{k}={v}" for k, v in fp.explained["engine_value"].items()) or "none"
        rows.append({"engine": spec, "first_divergence": div.site if div else "none",
                     "dlogprob_mean": float(cmp.table["dlogprob_mean"].dropna().iloc[0]),
                     "logits_rel_l2": float(cmp.table.loc["logits", "rel_l2"]),
                     "fingerprint_distance": fp.distance, "knobs_found": knobs, "gap_start": fp.gap_start})
    sites = pd.DataFrame(columns).reindex(train.sites).dropna(how="all")
    return ThreeEngines(sites, pd.DataFrame(rows).set_index("engine"))


def runnable(engines: tuple[str, ...] = ENGINES) -> tuple[str, ...]:
    """Those of ``engines`` that can run on this machine; each left out is printed with its
    one-line reason (a notebook on macOS still gets the minirl column)."""
    from minirl.sglang.runner import unavailable_reason as sglang_reason
    from minirl.vllm.llm import unavailable_reason as vllm_reason

    reasons = {"vllm": vllm_reason, "sglang": sglang_reason}
    keep = []
    for spec in engines:
        reason = reasons.get(spec.split(":")[0], lambda: None)()
        if reason:
            print(f"{spec} left out: {reason}")
        else:
            keep.append(spec)
    return tuple(keep)


def figure(result: ThreeEngines) -> Figure:
    """Each engine's rel. L2 against the fp32 trainer, site by site in execution order (log
    scale): where a curve leaves the others is where that engine's arithmetic differs."""
    sites = result.sites
    fig = Figure(figsize=(9, 3.4))
    ax = fig.subplots()
    for spec in sites.columns:
        ax.plot(range(len(sites)), sites[spec].clip(lower=1e-9), marker=".", lw=1, label=spec)
    ticks = [i for i, s in enumerate(sites.index) if not s.startswith("L") or s.endswith(".resid_post")]
    ax.set_xticks(ticks, [sites.index[i] for i in ticks], rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("rel. L2 vs fp32 trainer")
    ax.set_title("three bf16 engines against one fp32 trainer")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: A fingerprint distance below this share of the engine's own gap to the trainer: minirl models it closely;
#: below ``ROUGHLY``: roughly; above: its knobs do not model that engine.
CLOSELY, ROUGHLY = 0.25, 0.75
#: Engines whose mean |Δ logprob| are within this relative margin: none is called closest.
TIE = 0.05


def modelled(distance: float, gap: float) -> str:
    """How well minirl's closest knob setting models an engine: ``distance`` (fingerprint, nats
    per token) as a share of the engine's own ``gap`` to the trainer."""
    share = distance / gap
    return ("models it **closely**" if share < CLOSELY else "models it **only roughly**" if share < ROUGHLY
            else "does **not** model it")


def closest(result: ThreeEngines) -> str:
    """Which engine's log-probs are closest to the trainer's, or that neither of the two closest is (their
    mean |Δ logprob| within ``TIE`` of each other), with every engine's value."""
    gaps = result.summary["dlogprob_mean"].sort_values()
    values = ", ".join(f"`{e}` {v:.2g}" for e, v in gaps.items())
    if len(gaps) > 1 and (gaps.iloc[1] - gaps.iloc[0]) / gaps.iloc[1] < TIE:
        return (f"At the log-probs `{gaps.index[0]}` and `{gaps.index[1]}` are within {TIE:.0%} of each other "
                f"({values} nats/token): neither is clearly closest")
    rest = ", ".join(f"`{e}` {v:.2g}" for e, v in gaps.iloc[1:].items())
    return (f"Closest to the trainer at the log-probs: `{gaps.index[0]}` ({gaps.iloc[0]:.2g} nats/token"
            + (f"; then {rest}" if rest else "") + ")")


def sentence(result: ThreeEngines) -> str:
    """The reading of the table, every number and direction from it: which engine is closest to
    the trainer (``closest``), where each first diverges, and how well minirl's knobs model each
    real engine."""
    s = result.summary
    first = ", ".join(f"`{e}` at `{r.first_divergence}`" for e, r in s.iterrows())
    models = []
    for e, r in s.drop([e for e in s.index if e.startswith("minirl")]).iterrows():
        how = modelled(r.fingerprint_distance, r.dlogprob_mean)
        start = f" (the unexplained gap starts at `{r.gap_start}`)" if r.gap_start else ""
        models.append(f"`{e}`: the closest minirl setting ({r.knobs_found}) stays {r.fingerprint_distance:.2g} "
                      f"nats/token away, {r.fingerprint_distance / r.dlogprob_mean:.0%} of its own gap, "
                      f"so minirl {how}{start}")
    return (closest(result) + ". First divergence: " + first + "."
            + ("" if not models else " " + "; ".join(models) + "."))


def markdown(result: ThreeEngines, every_site: bool = False) -> str:
    """The summary table and the per-site table (layer sites of the first and last layer only,
    unless ``every_site``) as markdown."""
    sites = result.sites
    if not every_site:
        layers = sorted({int(s[1:].split(".")[0]) for s in sites.index if s.startswith("L")})
        keep = {f"L{layers[0]}.", f"L{layers[-1]}."} if layers else set()
        sites = sites[[not s.startswith("L") or s.startswith(tuple(keep)) for s in sites.index]]
    return (_table(result.summary.reset_index(), "{:.3g}") + "\n" + _table(sites.reset_index(), "{:.2e}"))


def _table(df: pd.DataFrame, fmt: str) -> str:
    cell = lambda v: fmt.format(v) if isinstance(v, float) else str(v)  # noqa: E731
    rows = [list(map(str, df.columns)), ["---"] * len(df.columns)] + [[cell(v) for v in r] for r in df.to_numpy()]
    return "".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n" for r in rows)


def main() -> None:
    """``python -m labs.three_engines [PATH] [TOKENS]``: the table on smollm2 (default) in markdown."""
    import sys

    from labs import zoo

    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else zoo.build("smollm2-135m")
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    print(markdown(three_engines(path, tokens)))


if __name__ == "__main__":
    main()
