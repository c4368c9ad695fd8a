"""``make demo``: the main job on the embedded default model (no downloads).

The story in one run: a typical inference engine (minirl, bf16, fused kernels) against the
float32 training engine (transformers) on the zoo's tiny Qwen3-MoE - the alignment gate says
*whether* they agree and *where* they part ways, knob attribution says *which* engine
choice explains how much of the logprob gap, and the aligned engine is shown passing for
contrast. Last, the same question with a bf16 trainer on both sides, where the dtype no
longer hides the knobs: the first divergence and the attribution name the engine choices
themselves. Then the engine people actually use: real vLLM (its CPU build, bf16) through the
same gate, and its fingerprint - the minirl knobs that come closest to it and the site where the
rest of the gap starts. Everything lands in ``runs/demo/`` (report.html + PNGs). The exit code is 0 even
though the gate fails: showing that failure is the point of the demo.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import aligntools
from aligntools import attribute, check_alignment
from aligntools.gates.alignment import GateResult, banner  # banner: the report's verdicts with numbers
from aligntools.replayer.attribution import Attribution
from aligntools.viz.report import Report
from labs import zoo
from minirl import Knobs

MODEL = "tiny-qwen3-moe"
TOKENS = 256
"""Tokens of built-in text each section runs on (``--tokens``' default)."""
GATE = ("hf", "minirl")
"""Section 1's engines (train, infer): the gate whose error-growth figure is the README's hero image."""
HERO = Path(__file__).resolve().parent.parent / "docs" / "img" / "demo_error_growth.png"
"""The README's hero image: section 1's ``error_growth.png``, copied there by ``--hero`` with a stamp
beside it (``HERO.with_suffix(".json")``: the ``figure_version`` it was drawn at, its sha256, the day)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens of built-in text (default: {TOKENS})")
    parser.add_argument("--hero", action="store_true",
                        help=f"also copy section 1's error_growth.png to the README's hero image ({HERO.name}) with "
                             f"its stamp (at the default --tokens only)")
    args = parser.parse_args(argv)
    if args.hero and args.tokens != TOKENS:
        parser.error(f"--hero draws the README's figure at the default --tokens {TOKENS}; drop --tokens {args.tokens}")
    start = time.perf_counter()
    out = Path(args.out)

    path = zoo.build(MODEL)
    meta = json.loads((path / "zoo.json").read_text())
    print(f"model: {meta['name']} at {path}: {meta['description']}, {meta['n_params']:,} params\n")

    _section("1. Alignment gate: typical bf16 inference engine vs float32 training engine")
    gate = check_alignment(path, train=GATE[0], infer=GATE[1], tokens=args.tokens)
    print(gate.summary())

    _section("2. Which knob explains the gap?")
    attr = attribute(path, train="hf", dtype="bfloat16", tokens=args.tokens)
    print(attr.summary())

    _section("3. For contrast: the aligned engine in float32")
    aligned = check_alignment(path, train="hf", infer="minirl:aligned", dtype="float32", tokens=args.tokens)
    print(f"{aligned.verdict}; mean |Δ logprob| {aligned.logprob.loc['mean', 'value']:.3g} "
          f"(typical bf16: {gate.logprob.loc['mean', 'value']:.3g})")

    _section("4. Same dtype on both sides: bf16 training engine vs typical bf16 inference engine")
    same = check_alignment(path, train="hf:bfloat16", infer="minirl", tokens=args.tokens)
    div = same.first_divergence
    print(same.verdict)
    print(f"first divergence: {div.site} (x{div.factor:.3g}): {div.reason}" if div else "first divergence: none")
    for finding in same.diagnosis[:3]:
        print(f"  {finding}")
    same_attr = attribute(path, train="hf:bfloat16", dtype="bfloat16", tokens=args.tokens, target=Knobs.hf_exact())
    print(same_attr.summary())

    _section("5. The engine people actually use: real vLLM (CPU build, bf16) vs the float32 trainer")
    vllm_gate, vllm_fp, vllm_lines = real_vllm(path, args.tokens)
    print("\n".join(vllm_lines))

    report = gate.report()
    vllm_section(report, vllm_gate, vllm_fp, vllm_lines)
    attribution_section(report, "Knob attribution (float32 trainer)", attr)
    report.heading("For contrast: the aligned float32 engine").verdict(aligned.passed, banner(aligned))
    report.heading("Same dtype on both sides (bf16 trainer)").verdict(same.passed, banner(same))
    same.explain(report)
    attribution_section(report, "Knob attribution (bf16 trainer, knobs toggled to hf_exact)", same_attr)
    written = [report.write(out / "report.html")]
    figures = {**gate.figures(), "attribution": attr.plot(), "attribution_bf16_trainer": same_attr.plot()}
    for name, fig in figures.items():
        fig.savefig(out / f"{name}.png", dpi=100, bbox_inches="tight")
        written.append(out / f"{name}.png")
    if args.hero:
        written.append(write_hero(out / "error_growth.png"))

    _section("Verdict")
    print(gate.verdict)
    print(f"top knob: {attr.ranked[0]} explains {attr.table.loc[attr.ranked[0], 'share']:.0%} of the gap alone; "
          f"the bf16 dtype itself leaves {attr.residual_gap:.3g} ({attr.residual_gap / attr.baseline_gap:.0%})")
    print("wrote:\n" + "\n".join(f"  {p}" for p in written))
    print(f"done in {time.perf_counter() - start:.1f} s")
    print("next: `make reproduce` reruns every paper finding at full size (table: paper vs ours); "
          "`make lab` opens the notebooks (00_quickstart ... 09_async_scale_out)")
    return 0


def figure_version() -> str:
    """What the hero figure is drawn from, as 16 hex digits: the drawing code (aligntools/viz/plots.py),
    the model's zoo recipe (``labs.zoo``'s fingerprint: config, training, corpus, transformers'
    version), section 1's engines and token count. A change to any of them makes the README's image
    stale (``tests/labs/test_hero_image.py`` says so); the engines' own arithmetic is not in it."""
    from aligntools.viz import plots

    recipe = zoo._fingerprint(MODEL, zoo._spec(MODEL), 0)
    blob = json.dumps([Path(plots.__file__).read_text(), MODEL, recipe, GATE, TOKENS])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_hero(png: Path, hero: Path = HERO) -> Path:
    """Copy ``png`` (section 1's ``error_growth.png`` of this run) to the README's hero image and
    stamp it: ``figure_version``, the image's sha256, the day and where it came from."""
    shutil.copyfile(png, hero)
    stamp = {"figure_version": figure_version(), "png_sha256": hashlib.sha256(hero.read_bytes()).hexdigest(),
             "made": datetime.date.today().isoformat(),
             "from": f"python -m labs.demo --hero (make demo's run, section 1: {GATE[1]} vs {GATE[0]}, "
                     f"{TOKENS} tokens, {MODEL})"}
    hero.with_suffix(".json").write_text(json.dumps(stamp, indent=1) + "\n")
    return hero


def real_vllm(path: Path, tokens: int) -> tuple[GateResult | None, object, list[str]]:
    """The gate on real vLLM and its fingerprint (which minirl knobs reproduce it, where the rest
    of the gap starts), and the lines printed for them; (None, None, one line saying why) when vLLM
    cannot run here."""
    from aligntools.gates.inputs import prepare_tokens
    from minirl.vllm.llm import create_llm, unavailable_reason

    reason = unavailable_reason()
    if reason:
        return None, None, [f"skipped: {reason}"]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its per-weight dtype warnings drown the demo
    result = check_alignment(path, train="hf", infer="vllm:bfloat16", tokens=tokens)
    div = result.first_divergence
    capture = aligntools.capture(create_llm(path, "bfloat16"), prepare_tokens(path, 128), progress=False)
    fp = aligntools.fingerprint(capture, path, progress=False)
    lines = [result.verdict, f"mean |Δ logprob| {result.logprob.loc['mean', 'value']:.3g} (max "
                             f"{result.logprob.loc['max', 'value']:.3g})",
             f"first divergence: {div.site} (x{div.factor:.3g})" if div else "first divergence: none",
             fingerprint_line(fp)]
    return result, fp, lines


def fingerprint_line(fp) -> str:  # noqa: ANN001 - an aligntools.Fingerprint
    """The fingerprint in a sentence for the terminal (the report shows its tables): its repr,
    ``Fingerprint(distance=...)``, printed raw read as a debugging dump."""
    knobs = ", ".join(f"{k}={v}" for k, v in fp.explained["engine_value"].items())
    gap = (f"the rest of the gap starts at {fp.gap_start} (rel-L2 {fp.table['best'][fp.gap_start]:.2g})"
           if fp.gap_start else "no site diverges past that")
    return (f"fingerprint: the closest minirl setting ({fp.evaluated} tried) is {fp.distance:.3g} mean |Δ logprob| "
            f"from vLLM; " + (f"it differs from hf_exact in {knobs}" if knobs else "it is hf_exact itself")
            + f"; {gap}")


def vllm_section(report: Report, result: GateResult | None, fp: object, lines: list[str]) -> None:
    """Real vLLM's banner with its numbers, its first divergence and its fingerprint as tables."""
    report.heading("Real vLLM (CPU build, bf16) vs the float32 trainer")
    if result is None:
        report.text(lines[0])
        return
    report.verdict(result.passed, banner(result)).text(lines[1] + "; " + lines[2])
    report.fingerprint(fp)


def attribution_section(report: Report, title: str, attr: Attribution) -> None:
    """Attribution as a table (shares as percentages), why they need not sum to 100%, the chart."""
    cols = ["infer", "aligned", "gap_alone", "share", "gap_cumulative", "share_cumulative"]
    report.heading(title).text(f"Baseline mean |Δ logprob| {attr.baseline_gap:.3g}; "
                               f"with every knob aligned {attr.residual_gap:.3g}.")
    report.table(attr.table[cols], formats={"share": "{:.0%}", "share_cumulative": "{:.0%}"})
    report.text(attr.share_note())
    top = attr.ranked[0] if attr.ranked else None
    caption = (f"Left: each knob's share alone ({top} is the largest, {attr.table.loc[top, 'share']:.0%}); right: "
               f"the gap as knobs are aligned one after another, down to {attr.residual_gap:.3g}."
               if top else "No knob differs from the target.")
    report.figure(attr.plot(), caption)


def _section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


if __name__ == "__main__":
    sys.exit(main())
