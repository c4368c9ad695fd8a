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
