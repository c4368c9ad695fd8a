"""Alignment gate: is the inference engine aligned with the training engine on the same tokens?

Both engines run the same token ids (teacher-forced, prefill); their captures are compared
site by site, plus the MoE routing and the final per-token logprob. Every limit is relative
to a *measured* noise floor (docs/conventions.md): the training engine is also run in
float64, and the error of the training engine's own dtype against that float64 run is what
"correct" looks like on this model. A site passes when

    err(train vs infer) <= k * err(train vs train@float64) + atol(dtype)

with k and atol per dtype of the compared pair (``aligntools.analyzer.tolerance.DTYPE_RULES``: k = 2
for float32, 3 for half types) - the rule of PyTorch Dynamo's ``same()``
(torch/_dynamo/utils.py: ``res_error <= multiplier * ref_error + tol / 10`` against an
fp64 reference, ``multiplier`` 2.0, 3.0 for low precision). The same rule bounds the routing
flip fraction and the final mean/max |Δ logprob| (``LOGPROB_ATOL``, ``FLIP_ATOL``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import torch

from aligntools import sites as S
from aligntools.analyzer.diagnosis import diagnose
from aligntools.analyzer.tolerance import Tolerance, coarser
from aligntools.drilldown import gate as drill_gate
from aligntools.gates.inputs import GateUsageError, load_hf, parse_infer, parse_train, prepare_tokens, validate_checkpoint
from aligntools.viz.report import Report

LOGPROB_ATOL: dict[str, tuple[float, float]] = {
    # dtype -> (atol on mean |Δ logprob|, atol on max |Δ logprob|). fp32: an order above the
    # ~1e-6 that two correct fp32 engines differ by (sdpa vs eager, fused vs unfused GEMMs).
    # bf16: a quarter of bf16's unit roundoff (2**-9 ~ 2e-3) on the mean; a bf16 engine that
    # rounds only where it must lands near 2e-3, an unaligned one several times above.
    "float64": (1e-10, 1e-9),
    "float32": (1e-5, 1e-4),
    "float16": (2e-4, 2e-3),
    "bfloat16": (5e-4, 5e-3),
}
FLIP_ATOL: dict[str, float] = {
    # dtype -> allowed fraction of tokens whose top-k expert set differs, above k x the
    # training engine's own flips against float64. fp32 leaves room for one near-tie in 500.
    "float64": 0.0, "float32": 2e-3, "float16": 1e-2, "bfloat16": 1e-2,
}


# ---------------------------------------------------------------- the gate

SITE_COLUMNS = ["dtype", "rel_l2", "noise_floor", "limit", "growth", "passes"]


@dataclass
class GateResult:
    """Verdict of ``check_alignment`` with everything that explains it.

    ``table``: per site (execution order) ``dtype``, ``rel_l2`` (train vs infer),
    ``noise_floor`` (train vs train@float64), ``limit``, ``growth``, ``passes``.
    ``routing``: per MoE layer ``set_flip`` vs ``allowed`` (+ the Analyzer's margins).
    ``logprob``: final |Δ logprob| mean/max with their floors and limits.
    ``reasons``: one sentence per failed check (empty when ``passed``).
    ``drilldown``: the ``aligntools.drill`` of the first divergent site, when ``mlab check --drill`` ran it.
    """

    passed: bool
    table: pd.DataFrame
    routing: pd.DataFrame
    logprob: pd.DataFrame
    reasons: list[str]
    comparison: object
    setup: dict = field(default_factory=dict)
    drilldown: object = None

    @property
    def first_divergence(self):
        return self.comparison.first_divergence

    @cached_property
    def diagnosis(self) -> list:
        """The Analyzer's findings, each quoting the site this verdict names where its cause
        fired at several (``verdict_sites``): a failing layer's flip rate, not a passing one's."""
        c = self.comparison
        return diagnose(c.growth, c.table, c.routing, c.per_token, prefer=self.verdict_sites())

    def verdict_sites(self) -> list[str]:
        """Sites the verdict names, most quoted first: the worst and the first failing site, each
        failing routing layer's ``topk_ids``, ``logits`` when the final logprob fails, then every
        other failing site in execution order."""
        failed = list(self.table.index[~self.table["passes"].astype(bool)])
        named = [_worst(self.table), failed[0]] if failed else []
        named += [f"L{i}.topk_ids" for i in self.routing.index[~self.routing["passes"]]]
        named += ["logits"] if not self.logprob["passes"].all() else []
        return list(dict.fromkeys(named + failed))

    @property
    def coverage(self) -> str:
        """"N of M sites compared" (M: the sites either side captured, less those excluded by
        name), then the sites only one side has and the excluded ones, by name: a verdict on the
        intersection alone must say what it left out."""
        cov = self.setup.get("sites")
        if cov is None:
            return f"{len(self.table)} sites compared"
        line = f"{cov['compared']} of {cov['total']} sites compared"
        for side in ("train", "infer"):
            if cov[f"only_{side}"]:
                line += f"; only on {self.setup[side]}: {', '.join(cov[f'only_{side}'])}"
        return line + (f"; excluded: {', '.join(cov['excluded'])}" if cov["excluded"] else "")

    @property
    def verdict(self) -> str:
        head = "ALIGNED" if self.passed else "MISALIGNED"
        return f"{head}: {self.setup['infer']} vs {self.setup['train']}" + (
            "" if self.passed else " - " + "; ".join(self.reasons))

    @property
    def banner(self) -> str:
        """``verdict`` with its numbers: ``mlab check``'s last line and the report's banner (``banner``)."""
        return banner(self)

    def summary(self) -> str:
        """What ``mlab check`` prints: setup, site table, routing, logprobs, first divergence,
        diagnosis, verdict."""
        fmt = lambda v: f"{v:.3g}"  # noqa: E731
        t = self.site_table().map(lambda v: v if isinstance(v, str) else ("pass" if v else "FAIL")
                                  if isinstance(v, bool) else fmt(v))
        out = [_setup_line(self.setup), t.to_string()]
        if len(self.routing):
            out.append("routing (fraction of tokens whose top-k expert set changed):\n"
                       + self.routing[["set_flip", "allowed", "near_tie", "passes"]].to_string(float_format=fmt))
        out.append("final |Δ logprob| over scored tokens:\n" + self.logprob.to_string(float_format=fmt))
        fd = self.first_divergence
        out.append(str(fd) if fd else "first divergence: none (no site jumps above its inputs' error)")
        out.extend(["diagnosis:", *(f"  {f}" for f in self.diagnosis)] if self.diagnosis else ["diagnosis: no findings"])
        out.extend(drill_gate.summary_lines(self))
        out.extend(self.setup.get("invariants", []))
        out.append(self.coverage)
        out.append(self.banner)
        return "\n".join(out)

    def site_table(self) -> pd.DataFrame:
        """``table`` as shown to a person: NaN reads ``n/a``; expert-id rows carry no float error
        (their flips are gated in ``routing``), so they read ``exact`` (identical ids) or ``n/a``."""
        t = self.table.astype(object).where(self.table.notna(), "n/a")
        for site in [s for s in t.index if S.parse(s).kind == "topk_ids"]:
            layer = S.parse(site).layer
            r = self.routing.loc[layer] if layer in self.routing.index else None
            exact = r is not None and r["set_flip"] == 0 and r["order_flip"] == 0
            t.loc[site, ["rel_l2", "passes"]] = ["exact" if exact else "n/a", "n/a"]
        return t

    def figures(self) -> dict[str, object]:
        """Named matplotlib figures: ``error_growth`` (the Analyzer's plot), ``logprob_gap``."""
        from matplotlib.figure import Figure

        from aligntools.viz.plots import plot_comparison

        figs = {"error_growth": plot_comparison(self.comparison)}
        fig = Figure(figsize=(8, 3.6))
        ax = fig.subplots()
        dlp = self.comparison.per_token("logits")["dlogprob"].dropna()
        ax.hist(np.log10(np.maximum(dlp.to_numpy(), 1e-12)), bins=40, color="#c0392b")
        ax.axvline(np.log10(self.logprob.loc["mean", "limit"]), ls="--", c="k", label="limit on the mean")
        ax.set(xlabel="log10 |Δ logprob| per token", ylabel="tokens",
               title=f"per-token |Δ logprob|: {self.setup['infer']} vs {self.setup['train']}")
        ax.legend()
        fig.tight_layout()
        figs["logprob_gap"] = fig
        return figs

    def report(self) -> Report:
        """The self-contained HTML report (``Report.write(path)`` writes it)."""
        r = Report(f"Alignment gate: {self.setup['infer']} vs {self.setup['train']}")
        r.verdict(self.passed, self.banner)
        figs = self.figures()  # verdict -> where it goes wrong (plots) -> why -> the failing rows
        r.heading("Where the error grows").figure(figs["error_growth"], _growth_caption(self))
        r.heading("Per-token |Δ logprob|").figure(
            figs["logprob_gap"], "Tokens to the right of the dashed line are each off by more than the limit "
            "on the mean; a long right tail means a few tokens (often routing flips) carry the gap.")
        self.explain(r)
        r.heading("Final |Δ logprob|").table(self.logprob, failed=~self.logprob["passes"])
        if len(self.routing):
            r.heading("Routing").table(self.routing, failed=~self.routing["passes"])
            r.text("set_flip: share of tokens whose top-k expert set changed; near_tie: share of those "
                   "flips whose router-score margin is within the score error (n/a: no flips).")
        r.heading("Per-site errors (relative L2, train vs infer), failing sites first").table(
            self.site_table(), failed=~self.table["passes"], shown=10)
        r.text("growth = a site's error over its inputs' error: a site far above 1 is where the error starts. "
               "Expert-id rows (topk_ids) read exact (identical ids) or n/a; their flips are gated in Routing.")
        r.heading("Setup")
        r.text(_setup_line(self.setup))
        r.text("Limits: k x noise floor + atol (dtype of the pair); noise floor = the training engine's "
               "own error against a float64 run of the same model on the same tokens.")
        r.text("Inference knobs:").bullets([f"{k}={v}" for k, v in self.setup["knobs"].items()])
        return r

    def explain(self, r: Report) -> Report:
        """First divergence and diagnosis sections (also used for the demo's further runs)."""
        fd = self.first_divergence
        r.heading("First divergence").text(str(fd) if fd else "none: no site jumps above its inputs' error")
        r.heading("Diagnosis")
        for f in self.diagnosis or ["no findings"]:
            r.text(str(f))
        return drill_gate.report_section(drill_gate.diagnosis_link(r, self), self)

    def write_report(self, path: str | os.PathLike) -> Path:
        return self.report().write(path)


def banner(gate: GateResult) -> str:
    """A verdict that carries its numbers. MISALIGNED is ``verdict``, which already quotes each check
    over its limit; ALIGNED adds the gap, its limit and why the limit holds, the routing flips and
    the sites within their limits (a bare green "ALIGNED" sat beside a 0.0038-nat gap and 1.6 % of
    tokens changing experts, and read as "identical"). Any object with ``passed``, ``verdict``,
    ``logprob``, ``routing`` and ``table`` as a ``GateResult`` has them will do."""
    if not gate.passed:
        return gate.verdict
    mean = gate.logprob.loc["mean"]
    dtype = str(gate.table.loc["logits", "dtype"]) if "logits" in gate.table.index else None
    atol = LOGPROB_ATOL.get(dtype, (0.0,))[0]
    if mean["noise_floor"] > 0:
        k = (mean["limit"] - atol) / mean["noise_floor"]
        limit = (f"{k:.2g} x the trainer's own gap to a float64 run of the same model ({mean['noise_floor']:.2g}) + "
                 f"{atol:.2g} for {dtype} rounding: no engine can be expected closer to the trainer than the trainer "
                 f"is to float64, so a gap within a small multiple of that is the dtype's own noise")
    else:
        limit = (f"{atol:.2g} for {dtype} rounding alone (the trainer matches a float64 run of the same model "
                 f"exactly here, so only the rounding allowance remains)")
    text = f"{gate.verdict}. Mean |Δ logprob| {mean['value']:.2g} is within its limit {mean['limit']:.2g} = {limit}."
    if len(gate.routing):
        layer = gate.routing["set_flip"].idxmax()
        r = gate.routing.loc[layer]
        text += (f" At most {r['set_flip']:.1%} of tokens change top-k experts (layer {layer}; allowed "
                 f"{r['allowed']:.1%})." if r["set_flip"] > 0 else
                 f" No token changes its top-k experts (allowed up to {r['allowed']:.1%} per layer).")
    sites = gate.table[gate.table["rel_l2"].notna()]  # an expert-id row carries no float error (n/a)
    ids = len(gate.table) - len(sites)
    return text + f" {int(sites['passes'].astype(bool).sum())} of {len(sites)} sites within their limits" + (
        f" (the other {ids} compared, expert ids, are judged by their flips)." if ids and len(gate.routing) else ".")


def _growth_caption(gate: GateResult) -> str:
    """One sentence saying what the error-growth figure shows for this run."""
    t = gate.table[gate.table["growth"].notna() & np.isfinite(gate.table["growth"])]
    if t.empty:
        return "Relative L2 error per site (left) and per token at each layer's output (right)."
    top = t["growth"].idxmax()
    return (f"Left: relative L2 error per site in execution order against its limit (dashed); the largest "
            f"jump over its inputs is {top} (x{t.loc[top, 'growth']:.3g}). Right: the same error per token at "
            f"each layer's output; bright rows are tokens that carry most of it.")


def _setup_line(setup: dict) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in setup["knob_overrides"].items()) or "preset values"
    kern = setup.get("train_kernels", {})
    train = f"{setup['train']} (attention {kern.get('attn')}, experts {kern.get('experts')})" if kern else setup["train"]
    return (f"model {setup['model']}; {setup['n_tokens']} tokens ({setup['batch']} sequences); "
            f"train {train}; infer {setup['infer']} ({knobs})")


def check_alignment(model_path: str | os.PathLike, train: str = "hf", infer: str = "minirl",
                    dtype: str | None = None, tokens: int | torch.Tensor = 256,
                    tolerance: str | os.PathLike | Tolerance | None = None,
                    progress: bool = True, exclude: Iterable[str] = ()) -> GateResult:
    """Run the gate (see the module docstring). Usage errors raise ``GateUsageError``.

    ``train``: ``hf`` (float32) or ``hf:bfloat16``. ``infer``: ``minirl[:PRESET][,knob=value]``
    with presets ``typical`` (default), ``aligned`` and ``hf_exact``. ``dtype``: the inference
    side's dtype (default bfloat16 for typical, float32 for the aligned presets). ``tokens``: built-in text token count
    or ids [B, S]. ``tolerance``: a Tolerance or a JSON file overriding the per-site rules.
    ``exclude``: site names left out of the verdict on purpose (a layer site only one side
    captures fails the gate unless it is named here).
    """
    from tqdm.auto import tqdm

    from aligntools.analyzer.comparison import compare
    from aligntools.invariants import prove_capture, prove_model, prove_reading
    from aligntools.tracker.tracker import capture
    from minirl import build_engine, engine_kind

    path = validate_checkpoint(model_path)
    exclude = check_exclude(exclude, possible_sites(path))  # before any capture: a typo costs no minutes
    train_spec = parse_train(train)
    inf = parse_infer(infer, dtype)
    policy = _tolerance(tolerance)
    ids = prepare_tokens(path, tokens)  # [B, S]
    bar = tqdm(total=5, desc="alignment gate", unit="step", disable=not progress)

    def step(what: str, fn):
        bar.set_postfix_str(what)
        value = fn()
        bar.update(1)
        return value

    train_model = load_hf(path, train_spec.dtype, **train_spec.options)
    inf = inf.following(train_model.config._attn_implementation)  # hf_exact takes the trainer's attention
    # both transformers captures run before the engine is built: vLLM's Transformers backend
    # (olmo2, starcoder2, ...) alters that family's transformers classes once it builds one; the
    # float64 model is dropped once captured, so it never sits beside the engine (2 GB on Gemma 3 270M)
    train_cap = step("train capture", lambda: capture(train_model, ids, progress=False))
    proofs = [prove_model(train_model, train_cap, ids).require()]  # a model read wrongly gets no verdict
    ref_cap = step("float64 capture", lambda: capture(load_hf(path, "float64"), ids, progress=False))
    engine = build_engine(inf.built, path)
    infer_cap = step("infer capture", lambda: capture(engine, ids, progress=False))
    proofs.append(prove_capture(infer_cap, train_model, where=inf.label).require())
    floor = step("noise floor", lambda: compare(ref_cap, train_cap, labels=("hf:float64", "train")))
    floors, _ = Tolerance.usable_floors({s: r.summary["rel_l2"] for s, r in floor.results.items()
                                         if "rel_l2" in r.summary})
    labels = (str(train_spec), inf.label)
    shared = [x for x in train_cap.sites if x in set(infer_cap.sites) - set(exclude)] if exclude else None
    cmp = step("compare", lambda: compare(train_cap, infer_cap, tolerance=policy.with_noise_floor(floors),
                                          labels=labels, sites=shared))
    bar.close()
    setup = {"model": str(path), "n_tokens": int(ids.numel()), "batch": int(ids.shape[0]), "train": labels[0],
             "infer": labels[1], "knob_overrides": inf.spec.options, "knobs": engine_kind(inf.spec.kind).settings(engine),
             "train_kernels": {"attn": train_model.config._attn_implementation,
                               "experts": getattr(train_model.config, "_experts_implementation", None)}}
    setup["sites"] = site_coverage(train_cap.sites, infer_cap.sites, cmp.table.index, exclude)
    result = _verdict(cmp, floor, floors, setup, coarser(train_spec.dtype, inf.spec.dtype))
    proofs.append(prove_reading(train_model, result.table["rel_l2"].dropna().to_dict(),
                                bool(result.logprob["passes"].all()), where=inf.label).require())
    setup["invariants"] = [p.line() for p in proofs]
    return result


def site_coverage(train: Iterable[str], infer: Iterable[str], compared: Iterable[str],
                  exclude: Iterable[str] = ()) -> dict:
    """What the gate compared out of what the two captures hold: counts, the sites on one side
    only (execution order) and the excluded ones; ``exclude`` is held to ``check_exclude`` against
    the sites the captures hold (a typo would otherwise exclude nothing, silently)."""
    train, infer = set(train), set(infer)
    exclude = check_exclude(exclude, train | infer)
    keep = lambda names: S.sort_sites([s for s in names if s not in exclude])  # noqa: E731
    done = [s for s in compared if s not in exclude]
    return {"compared": len(done), "total": len((train | infer) - set(exclude)), "only_train": keep(train - infer),
            "only_infer": keep(infer - train), "excluded": S.sort_sites(exclude)}


def possible_sites(path: Path) -> list[str]:
    """Every site name a capture of the checkpoint at ``path`` may hold (routing sites on every layer:
    whether a layer is MoE is the engines' reading), from its config.json's layer count; what
    ``check_exclude`` holds ``exclude`` to before the captures run."""
    config = json.loads((path / "config.json").read_text())
    n_layers = config.get("num_hidden_layers", (config.get("text_config") or {}).get("num_hidden_layers"))
    n_layers = n_layers if isinstance(n_layers, int) and not isinstance(n_layers, bool) else 0
    return S.all_sites(n_layers, moe_layers=set(range(n_layers)))


def check_exclude(exclude: object, sites: Iterable[str]) -> list[str]:
    """``exclude``'s site names, each once, checked against ``sites`` (what may be compared). Refused:
    a string or non-list (``"logits"`` would be seven one-letter names), a name that is not a string
    or not one of ``sites`` (quoted, so a stray space shows; globs are not read), every site but the
    routing ones (nothing left to compare), and ``logits``: the final logprob check reads it."""
    if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Iterable):
        raise GateUsageError(f"exclude={exclude!r}: expected a list of site names, e.g. exclude=['L0.q']")
    names, sites = list(dict.fromkeys(exclude)), S.sort_sites(list(set(sites)))
    odd = [n for n in names if not isinstance(n, str)]
    if odd:
        raise GateUsageError(f"exclude: {odd[0]!r} is not a site name; give names such as 'L0.q' (sites: "
                             f"{', '.join(sites)})")
    unknown = [n for n in names if n not in sites]
    if unknown:
        glob = " (names are exact: patterns such as 'L*' are not expanded)" if any("*" in n for n in unknown) else ""
        raise GateUsageError(f"--exclude {', '.join(map(repr, unknown))}: no such site in either capture{glob} "
                             f"(sites: {', '.join(sites)})")
    if all(s in names for s in sites if S.parse(s).kind not in S.ROUTING_SITES):
        raise GateUsageError(f"--exclude names every site ({len(names)}): nothing left to compare; exclude only "
                             f"the sites the verdict should leave out")
    if "logits" in names:
        raise GateUsageError("--exclude logits: logits cannot be excluded, the final logprob check (the gate's "
                             "third) reads it; exclude layer sites only")
    return names


def _tolerance(tolerance: str | os.PathLike | Tolerance | None) -> Tolerance:
    if tolerance is None or isinstance(tolerance, Tolerance):
        return tolerance or Tolerance()
    try:
        return Tolerance.load(tolerance)
    except (OSError, ValueError, TypeError) as e:
        raise GateUsageError(f"cannot use tolerance file {tolerance}: {e}") from e


def _verdict(cmp, floor, floors: dict[str, float], setup: dict, dtype: str) -> GateResult:
    """Combine the three checks (sites, routing, final logprob) into one verdict."""
    t = cmp.table
    table = t.assign(noise_floor=pd.Series(floors).reindex(t.index))[SITE_COLUMNS]
    reasons = []
    cov = setup.get("sites")
    one_sided = [s for side in ("only_train", "only_infer") for s in (cov[side] if cov else [])
                 if S.parse(s).layer is not None]
    if one_sided:
        reasons.append(f"{len(one_sided)} layer sites captured on one side only ({', '.join(one_sided[:6])}"
                       f"{', ...' if len(one_sided) > 6 else ''}): the verdict would cover only part of the model; "
                       f"exclude them by name (--exclude SITE) to gate without them")
    skipped = cmp.not_compared
    if skipped:
        reasons.append(f"{len(skipped)} sites not compared: " + "; ".join(f"{s} ({why})" for s, why in skipped.items()))
    failed = [s for s in table.index[~table["passes"]] if s not in skipped]
    if failed:
        blown = [s for s in failed if np.isinf(cmp.growth["error"].get(s, 0.0))]  # NaN/Inf values (nan_rows)
        worst = blown[0] if blown else _worst(table.loc[failed])  # rel_l2 leaves NaN/Inf out: it may read 0
        said = "NaN/Inf values" if blown else f"rel. L2 {table.loc[worst, 'rel_l2']:.3g}"
        reasons.append(f"{len(failed)} of {len(table)} sites over their limit (first {failed[0]}; worst {worst}: "
                       f"{said} > limit {table.loc[worst, 'limit']:.3g})")
    routing = _routing(cmp, floor, dtype)
    for layer, r in routing[~routing["passes"]].iterrows():
        reasons.append(f"L{layer}: {r['set_flip']:.1%} of tokens changed top-k experts (allowed {r['allowed']:.1%})")
    logprob = _logprob(cmp, floor, dtype)
    for stat, r in logprob[~logprob["passes"]].iterrows():
        reasons.append(f"{stat} |Δ logprob| {r['value']:.3g} > limit {r['limit']:.3g}" if np.isfinite(r["limit"]) else
                       f"{stat} |Δ logprob| has no limit: the training engine against itself gives "
                       f"{r['noise_floor']:.3g} (its logits are not finite)")
    return GateResult(passed=not reasons, table=table, routing=routing, logprob=logprob, reasons=reasons,
                      comparison=cmp, setup=setup)


def _worst(table: pd.DataFrame) -> str:
    """The site furthest over its limit (the verdict quotes its numbers)."""
    return (table["rel_l2"] / table["limit"]).idxmax()


def _routing(cmp, floor, dtype: str) -> pd.DataFrame:
    """Per MoE layer: set-flip fraction vs k x the training engine's own flips + FLIP_ATOL."""
    r = cmp.routing.copy()
    own = floor.routing["set_flip"].reindex(r.index).fillna(0.0)
    k = np.array([cmp.tolerance.rule(f"L{i}.topk_ids", dtype).k for i in r.index], dtype=float)
    r["allowed"] = k * own + FLIP_ATOL[dtype]
    r["passes"] = (r["set_flip"] <= r["allowed"]).astype(bool)
    return r


def _logprob(cmp, floor, dtype: str) -> pd.DataFrame:
    """mean / max |Δ logprob| of the scored tokens vs k x the training engine's own + atol."""
    if "logits" not in cmp.results:
        raise GateUsageError("the captures have no logits site: the final logprob cannot be checked")
    k = cmp.tolerance.rule("logits", dtype).k
    rows = []
    for stat, atol in zip(("mean", "max"), LOGPROB_ATOL[dtype]):
        value = cmp.results["logits"].summary[f"dlogprob_{stat}"]
        own = floor.results["logits"].summary[f"dlogprob_{stat}"]
        limit = k * own + atol
        rows.append({"stat": stat, "value": value, "noise_floor": own, "limit": limit, "passes": bool(value <= limit)})
    return pd.DataFrame(rows).set_index("stat")
