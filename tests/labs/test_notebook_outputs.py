"""What the new notebooks must show: checks on the outputs of their tagged cells.

``tests/test_notebooks.py`` executes each notebook once and calls ``OUTPUT_CHECKS[name](nb)``, so
the assertions read the outputs of that run (no second execution). A cell is found by its
``metadata.tags``; a check asserts that a table has the expected rows, a figure was produced and
a number is in a sane range.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from aligntools.audit.by_size import REPRODUCES
from aligntools.audit.precision import KNOBS
from labs import on_policy_lab


def tagged(nb: nbformat.NotebookNode, tag: str) -> list[dict]:
    """Outputs of the code cell tagged ``tag`` (exactly one such cell must exist)."""
    cells = [c for c in nb.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag!r}, found {len(cells)}"
    return cells[0].get("outputs", [])


def text(outputs: list[dict]) -> str:
    return "\n".join(o.get("data", {}).get("text/plain", "") or o.get("text", "") for o in outputs)


def has_image(outputs: list[dict]) -> bool:
    return any("image/png" in o.get("data", {}) for o in outputs)


def row(outputs: list[dict], label: str) -> list[float]:
    """The numeric cells of the text/plain table row starting with ``label`` (words skipped),
    joined over the blocks pandas wraps a wide table into."""
    lines = [line.strip() for line in text(outputs).splitlines()
             if line.strip().startswith(label) and line.strip()[len(label):][:1] in ("", " ")]
    assert lines, f"no row {label!r} in:\n{text(outputs)}"
    return [float(_unit_free(tok)) for line in lines for tok in line[len(label):].split() if _is_number(tok)]


def _unit_free(tok: str) -> str:
    """A formatted cell's number: "3.41‰" and "1.27x" read as 3.41 and 1.27 (the unit is the column's)."""
    return tok.rstrip("‰%x")


def _is_number(tok: str) -> bool:
    try:
        float(_unit_free(tok))
    except ValueError:
        return False
    return True


def check_02(nb: nbformat.NotebookNode) -> None:
    for tag in ("checklist-fp32", "checklist-bf16"):
        out = tagged(nb, tag)
        assert has_image(out), tag
        for knob in ("rmsnorm", "rope", "expert_sum_order", "residual (dtype)"):
            assert knob in text(out), (tag, knob)
    assert "lm_head_dtype" in text(tagged(nb, "checklist-fp32"))
    assert 0 < row(tagged(nb, "checklist-fp32"), "lm_head_dtype")[0] < 0.1  # gap_alone, nats/token
    assert row(tagged(nb, "checklist-bf16"), "residual (dtype)")[0] == 0.0  # all knobs: bit-identical
    drift = tagged(nb, "decode-drift")
    assert has_image(drift) and all(0 < x < 0.1 for x in row(drift, "first quarter"))
    tp = tagged(nb, "tp-drift")
    assert has_image(tp) and row(tp, "1") == [0.0, 0.0] and 1e-4 < row(tp, "2")[0] < 0.1
    engines = tagged(nb, "three-engines")
    assert has_image(engines) and 0 < row(engines, "minirl:typical")[0] < 0.5  # mean |Δ logprob|, nats/token


def check_05(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "c3po-summary")
    assert has_image(out)
    sync, c3po = row(out, "synchronous"), row(out, "C3PO++")
    assert sync[0] > 0 and c3po[0] > 0  # rollout seconds per step
    assert 0.05 < sync[0] / c3po[0] < 20  # the speedup is measured, whatever it is
    assert c3po[-1] > sync[-1]  # a resume re-prefills: more prefilled tokens per sampled token
    training = tagged(nb, "c3po-training")
    assert has_image(training)
    for arm in ("synchronous", "C3PO++"):
        rollout_s, step_s, tokens, reward, accuracy = row(training, arm)
        assert 0 < rollout_s <= step_s and tokens > 0 and 0 <= reward <= 1 and 0 <= accuracy <= 1


def check_07(nb: nbformat.NotebookNode) -> None:
    codes = tagged(nb, "exit-codes")
    t = text(codes)
    assert re.search(r"aligned fp32\s+0\b", t) and re.search(r"typical bf16\s+1\b", t) and re.search(r"bad path\s+2\b", t), t
    assert has_image(tagged(nb, "report-plot"))
    assert "srcdoc" in "".join(o.get("data", {}).get("text/html", "") for o in tagged(nb, "report-inline"))
    assert "exit code 1" in text(tagged(nb, "pytest-run")) and "1 failed, 1 passed" in text(tagged(nb, "pytest-run"))


def check_08(nb: nbformat.NotebookNode) -> None:
    out = text(tagged(nb, "outcomes"))
    for outcome in ("stdout", "no_stdout", "error", "timeout"):
        assert re.search(rf"\s{outcome}\s", out), outcome
    sel = tagged(nb, "selection")
    assert "kept_by_roc" in text(sel) and sum(1 for line in text(sel).splitlines()[1:] if line.rstrip().endswith("True")) == 4
    curves = tagged(nb, "roc-curves")
    assert has_image(curves)
    for arm in ("GRPO-RoC", "GRPO"):
        first, last, acc = row(curves, arm)
        assert 0 <= first <= 1 and 0 <= last <= 1 and 0.3 < acc <= 1


OUTPUT_CHECKS: dict[str, Callable[[nbformat.NotebookNode], None]] = {
    "02_alignment_checklist.ipynb": check_02, "05_c3po_budget_rollouts.ipynb": check_05,
    "07_ci_gate.ipynb": check_07, "08_grpo_roc_tools.ipynb": check_08,
}


def _nb(tag: str, plain: str, png: bool = True) -> nbformat.NotebookNode:
    data = {"text/plain": plain, **({"image/png": "iVBORw0KGgo="} if png else {})}
    cell = new_code_cell("x", metadata={"tags": [tag]}, outputs=[new_output("display_data", data=data)])
    return new_notebook(cells=[cell])


def test_row_reads_numbers_after_the_label():
    nb = _nb("t", "      mean  max\ntp\n1  0.000000  0.0\n2  4.2e-03  0.026\n2x  9  9")
    assert row(tagged(nb, "t"), "2") == [4.2e-03, 0.026] and has_image(tagged(nb, "t"))


def test_missing_tag_or_row_fails_loudly():
    nb = _nb("t", "a 1", png=False)
    with pytest.raises(AssertionError):
        tagged(nb, "other")
    with pytest.raises(AssertionError):
        row(tagged(nb, "t"), "b")
    assert not has_image(tagged(nb, "t"))


def test_every_new_notebook_has_a_check():
    from tests.notebook_runner import NOTEBOOKS

    assert set(OUTPUT_CHECKS) <= {p.name for p in NOTEBOOKS.glob("*.ipynb")}


def check_03(nb: nbformat.NotebookNode) -> None:
    flips = tagged(nb, "routing-flips")
    assert has_image(flips)
    for layer in ("0", "1", "2", "3"):
        n_tokens, k, set_flip, *_ = row(flips, layer)
        assert n_tokens > 0 and k >= 1 and 0 <= set_flip <= 1
    assert has_image(tagged(nb, "explorer"))
    replay = tagged(nb, "replay")
    assert has_image(replay)
    none, r2, r3 = row(replay, "no replay"), row(replay, "R2"), row(replay, "R3")
    assert r2[:2] == none[:2]  # R2 at equal weights is the trainer's own routing
    assert 0 < r3[0] <= none[0] < 0.5 and r3[-1] >= 1  # mean |dlogprob| shrinks; reduction >= 1


def check_04(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "icepop-summary")
    assert has_image(out)
    arms = {arm: row(out, arm) for arm in ("GRPO", "TIS", "IcePop")}
    assert arms["GRPO"][-1] == 0 and 0 <= arms["IcePop"][-1] <= 1000  # masked per mille
    assert all(0 < v[3] < 1 for v in arms.values())  # mismatch KL: injected, finite, small
    sweep = tagged(nb, "masked-sweep")
    assert has_image(sweep)
    labels = list(dict.fromkeys(line.split()[0] for line in text(sweep).splitlines() if re.match(r"\d+\.\d+\s", line)))
    clean, noisy = row(sweep, labels[0]), row(sweep, labels[-1])  # noise 0 and the largest noise
    assert clean[0] > 100 and noisy[1] > clean[1] and noisy[3] > clean[3]  # more noise: more KL, more masked


def check_09(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "async-summary")
    assert has_image(out)
    sync, async_ = row(out, "sync"), row(out, "async")
    assert sync[0] > 0 and async_[0] > 0 and async_[3] <= 1 and 0.2 < async_[-1] < 5  # staleness, speedup
    assert has_image(tagged(nb, "timelines"))
    stale = tagged(nb, "staleness")
    assert has_image(stale) and "0 update(s) old in sync" in markdown(stale), markdown(stale)
    assert re.search(r"\bsync 0%", markdown(stale)) and f"{int(async_[3])} update(s) old in async" in markdown(stale)
    model = tagged(nb, "cost-model")
    assert has_image(model) and all(1 <= row(model, w)[-1] <= 2 for w in ("1", "64"))


OUTPUT_CHECKS.update({"03_moe_routing_and_replay.ipynb": check_03, "04_icepop_tis_grpo.ipynb": check_04,
                      "09_async_scale_out.ipynb": check_09})


# --- generated claims (labs.narrate) checked against the values printed beside them -------------

def markdown(outputs: list[dict]) -> str:
    """The Markdown a cell displayed (its generated prose)."""
    return "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)


def check_time_claim(md: str, candidate: float, baseline: float) -> None:
    """"N.NNx less/more time" names the direction of the means and their ratio (>= 1); a resolved
    difference (bold) is never also called noise, and the paper comparison agrees with it."""
    m = re.search(r"(\d+\.\d+)x (less|more) time", md)
    assert m, md
    assert m.group(2) == ("less" if candidate < baseline else "more"), (md, candidate, baseline)
    assert abs(float(m.group(1)) - max(candidate, baseline) / min(candidate, baseline)) < 0.011, md
    resolved = f"x {m.group(2)} time**" in md
    assert resolved != ("inside run-to-run noise" in md or "unmeasured" in md), md
    if resolved and m.group(2) == "more":
        assert "slower (" in md and "faster (" not in md
    if not resolved:
        assert "faster (" not in md and "slower (" not in md


def check_closing(nb: nbformat.NotebookNode, tag: str) -> str:
    md = markdown(tagged(nb, tag))
    assert "**Summary.**" in md and "**Next:**" in md and re.search(r"This run took \d+ s", md), md
    return md


def check_05_claims(nb: nbformat.NotebookNode) -> None:
    out, training = tagged(nb, "c3po-summary"), tagged(nb, "c3po-training")
    sync, c3po = row(out, "synchronous")[0], row(out, "C3PO++")[0]
    check_time_claim(markdown(tagged(nb, "c3po-reading")), c3po, sync)
    check_time_claim(markdown(tagged(nb, "c3po-training-reading")), row(training, "C3PO++")[0],
                     row(training, "synchronous")[0])
    end = check_closing(nb, "c3po-conclusion")
    fast_enough = min(sync / c3po, row(training, "synchronous")[0] / row(training, "C3PO++")[0]) >= 2.5 / 1.1
    assert ("reproduces in both" in end) <= fast_enough and ("does not reproduce" in end) != ("reproduces in both" in end)


def check_09_claims(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "async-summary")
    sync, async_ = row(out, "sync"), row(out, "async")
    check_time_claim(markdown(tagged(nb, "async-reading")), async_[0], sync[0])
    predicted, measured = row(tagged(nb, "cost-model"), "1")[-1], async_[-1]
    md = markdown(tagged(nb, "cost-model-reading"))
    assert ("is below it" not in md or measured < predicted) and ("is above it" not in md or measured > predicted), md
    end = check_closing(nb, "async-conclusion")
    assert ("below the cost" not in end or measured < predicted) and ("above the cost" not in end or measured > predicted)


def _permille_noise(permille: float, tokens: float) -> float:
    p = permille / 1000
    return 2 * 1000 * (p * (1 - p) / tokens) ** 0.5


def check_04_claims(nb: nbformat.NotebookNode) -> None:
    out = tagged(nb, "icepop-summary")
    peaks = {arm: row(out, arm)[2] for arm in ("GRPO", "TIS", "IcePop")}  # grad_norm_max
    top = max(peaks, key=peaks.get)
    md = markdown(tagged(nb, "icepop-reading"))
    assert f"{top}'s gradient norm peaks at {peaks[top]:.3g}" in md and "{'" not in md, md
    sweep = tagged(nb, "masked-sweep")
    labels = list(dict.fromkeys(line.split()[0] for line in text(sweep).splitlines() if re.match(r"\d+\.\d+\s", line)))
    (n0, *_, m0, _), (n1, *_, m1, _) = row(sweep, labels[0]), row(sweep, labels[-1])
    noise = max(_permille_noise(m0, n0), _permille_noise(m1, n1))
    grows, falls = m1 > 1.5 * m0 and m1 - m0 > noise, m0 > 1.5 * m1 and m0 - m1 > noise
    md = markdown(tagged(nb, "sweep-reading"))
    assert ("masked share grows" in md) == grows and ("masked share stays flat" in md) == (not grows and not falls), md
    assert ("grows" in check_closing(nb, "icepop-conclusion").split("masked share")[-1]) == grows
    check_04_quant_claims(nb)
    check_04_collapse_claims(text(tagged(nb, "collapse-verdict")), markdown(tagged(nb, "collapse-reading")))
    monitor = markdown(tagged(nb, "monitor-reading"))
    assert "moved to none" not in monitor and not re.search(r"\de-\d+ %", monitor), monitor
    check_quiet(nb)


def check_04_collapse_claims(table: str, md: str) -> None:
    """§5 names a run as collapsed by reward exactly when the verdict table's "reward collapsed" is True,
    and names apart each run flagged by a gradient spike alone."""
    flags = [line.split()[-2:] for line in table.splitlines() if line.split()[-1:] in (["True"], ["False"])]
    by_reward = sum(f[0] == "True" for f in flags)
    spike_only = sum(f == ["False", "True"] for f in flags)
    head, _, spikes = md.partition("The rule also flags")
    assert "By reward, " in head and head.split("By reward, ")[1].split(". ")[0].count("(reward ") == by_reward, md
    assert bool(spikes) == (spike_only > 0) and spikes.split(": a spike")[0].count(" seed ") == spike_only, (table, md)


def check_quiet(nb: nbformat.NotebookNode) -> None:
    """No red stderr box anywhere and no stray stdout line after the first cell (its size line)."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    streams = [(i, o) for i, c in enumerate(code) for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    noisy = [o["text"][:200] for i, o in streams if o["name"] == "stderr" or i > 0]
    assert not noisy, noisy


QUANT_FORMATS = ("none", "fp8_e4m3", "int8", "int4")


def check_04_quant_claims(nb: nbformat.NotebookNode) -> None:
    """Section 3: each format's gap claim (same order / Nx larger) and the masked-share claim
    agree with the table printed beside them."""
    out = tagged(nb, "quant-rollouts")
    assert has_image(out)
    rows = {f: row(out, f) for f in QUANT_FORMATS}  # tokens, mean, max |dlogp|, masked ‰, capped ‰, flips %
    md = markdown(tagged(nb, "quant-reading"))
    base = rows["none"][1]
    for fmt in QUANT_FORMATS[1:]:
        mean = rows[fmt][1]
        m = re.search(rf"{fmt}'s gap \(([\d.e-]+)\) is (of the same order as|\d+x (larger|smaller) than) bf16 alone", md)
        assert m and abs(float(m.group(1)) - mean) <= 0.05 * mean, (fmt, md)
        assert ("same order" in m.group(2)) == (1 / 3 <= mean / base <= 3), (fmt, mean, base, md)
        assert m.group(3) in (None, "larger" if mean > base else "smaller"), md
    resolved = [f for f, r in rows.items() if r[3] > _permille_noise(r[3], r[0])]
    assert ("no share above its binomial noise under any format" in md) == (not resolved), md
    for f in resolved:
        assert f"‰ of the tokens under {'bf16 weights' if f == 'none' else f} (" in md, md
    worst = max(QUANT_FORMATS[1:], key=lambda f: rows[f][-1])
    assert f"under {worst} {rows[worst][-1]:.2f}% of (position, MoE layer) pairs" in md, md


def check_03_claims(nb: nbformat.NotebookNode) -> None:
    replay = tagged(nb, "replay")
    fold = row(replay, "no replay")[0] / row(replay, "R3")[0]
    md = markdown(tagged(nb, "replay-reading"))
    assert ("removes the mean gap" in md) == (fold >= 10) and ("cuts the mean gap" in md) == (1.1 < fold < 10), md
    explorer = markdown(tagged(nb, "explorer-reading"))
    ratio = re.search(r"median (\d+\.\d+)x the other tokens", explorer)
    if ratio:
        assert ("bright rows" in explorer) == (float(ratio.group(1)) >= 1.5), explorer
    assert "float64 reference" in explorer or "first divergence is" in explorer  # 01 vs 03 is explained
    assert ("removes the mean gap" in check_closing(nb, "routing-conclusion")) == (fold >= 10)


def check_02_claims(nb: nbformat.NotebookNode) -> None:
    first, last = row(tagged(nb, "decode-drift"), "first quarter")[0], row(tagged(nb, "decode-drift"), "last quarter")[0]
    md = markdown(tagged(nb, "drift-reading"))
    if "gap grows with length here" in md:
        assert last > 1.5 * first, md
    else:
        assert "does **not** grow" in md and ("inside the noise" in md or last <= 1.5 * first), md
    check_02_bf16_claims(tagged(nb, "checklist-bf16"), markdown(tagged(nb, "bf16-reading")))
    baseline = float(re.search(r"starts (\S+) nats/token away", markdown(tagged(nb, "bf16-reading"))).group(1))
    tp2 = row(tagged(nb, "tp-drift"), "2")[0]
    md = markdown(tagged(nb, "tp-reading"))
    assert ("same order" in md) == (1 / 3 <= tp2 / baseline <= 3) or abs(tp2 / baseline - 3) < 0.2, md
    check_three_engines_claims(tagged(nb, "three-engines"), markdown(tagged(nb, "three-engines-reading")))
    check_closing(nb, "checklist-conclusion")
    check_quiet(nb)


def check_02_bf16_claims(table: list[dict], md: str) -> None:
    """§2 names the knob where the plotted cumulative gap (the table's last column) first reaches 0,
    or says it never does; no "all-or-nothing" claim beside a line that reaches 0 early."""
    assert "all-or-nothing" not in md and "only all of them" not in md, md
    m = re.search(r"reaches \*\*0\*\* after (\d+) of (\d+) knobs \(([^)]*)\)", md)
    if not m:
        assert "never bring the cumulative gap to 0" in md and row(table, "residual (dtype)")[-1] != 0, md
        return
    knobs = re.findall(r"`(\w+)`", m.group(3))
    assert len(knobs) == int(m.group(1)) and row(table, knobs[-1])[-1] == 0, md
    assert all(row(table, k)[-1] != 0 for k in knobs[:-1]), md


def check_three_engines_claims(table: list[dict], md: str) -> None:
    """The reading names the engine whose mean |Δ logprob| the table shows smallest (or a tie),
    and says of each real engine how well minirl models it as its numbers in the table say."""
    from labs.three_engines import TIE, modelled

    engines = re.findall(r"`((?:vllm|sglang|minirl):\w+)`", md.split(". First divergence")[0])
    gaps = {e: row(table, e)[0] for e in engines}
    ranked = sorted(gaps, key=gaps.get)
    tie = len(ranked) > 1 and (gaps[ranked[1]] - gaps[ranked[0]]) / gaps[ranked[1]] < TIE
    assert ("neither is clearly closest" in md) == tie and (tie or f"log-probs: `{ranked[0]}`" in md), md
    for engine in (e for e in engines if not e.startswith("minirl")):
        gap, _, distance = row(table, engine)
        clause = re.search(rf"`{engine}`: the closest minirl setting[^;]*", md)
        assert clause and modelled(distance, gap) in clause.group(0), (engine, md)


CLAIM_CHECKS: dict[str, Callable[[nbformat.NotebookNode], None]] = {
    "02_alignment_checklist.ipynb": check_02_claims, "03_moe_routing_and_replay.ipynb": check_03_claims,
    "04_icepop_tis_grpo.ipynb": check_04_claims, "05_c3po_budget_rollouts.ipynb": check_05_claims,
    "09_async_scale_out.ipynb": check_09_claims,
}


def _both(*checks: Callable[[nbformat.NotebookNode], None]) -> Callable[[nbformat.NotebookNode], None]:
    return lambda nb: [check(nb) for check in checks] and None


OUTPUT_CHECKS.update({name: _both(OUTPUT_CHECKS[name], check) if name in OUTPUT_CHECKS else check
                      for name, check in CLAIM_CHECKS.items()})


def _md_nb(tag: str, md: str) -> nbformat.NotebookNode:
    cell = new_code_cell("x", metadata={"tags": [tag]},
                         outputs=[new_output("display_data", data={"text/markdown": md, "text/plain": "<Markdown>"})])
    return new_notebook(cells=[cell])


def test_time_claim_check_catches_the_issues_contradiction():
    """05's old sentence: "0.79x less time" beside 9.27 s (C3PO++) vs 7.31 s (synchronous)."""
    with pytest.raises(AssertionError):
        check_time_claim("its rollout phase took 0.79x less time per step", 9.27, 7.31)
    check_time_claim("took **1.27x more time**, beyond run-to-run noise: slower (0.79x)", 9.27, 7.31)
    with pytest.raises(AssertionError):  # resolved and noisy at once
        check_time_claim("**1.27x more time**, inside run-to-run noise", 9.27, 7.31)


def test_closing_cell_needs_summary_next_step_and_runtime():
    check_closing(_md_nb("end", "**Summary.** x. This run took 12 s (small size).\n\n**Next:** y"), "end")
    with pytest.raises(AssertionError):
        check_closing(_md_nb("end", "**Summary.** x."), "end")


def test_quiet_check_catches_a_stderr_box_and_a_stray_stdout_line():
    first = new_code_cell("x", outputs=[new_output("stream", name="stdout", text="tiny-qwen3-moe-seed0 full size\n")])
    check_quiet(new_notebook(cells=[first]))
    for name, text in (("stderr", "[W] NUMA binding: Using MEMBIND policy\n"), ("stdout", "mismatch monitor: 2.3e-16 %\n")):
        later = new_code_cell("y", outputs=[new_output("stream", name=name, text=text)])
        with pytest.raises(AssertionError):
            check_quiet(new_notebook(cells=[first, later]))


def test_collapse_claim_check_reads_the_verdict_table_against_the_reading():
    import xarray as xr

    from labs import collapse_lab

    table = collapse_lab.verdict(xr.load_dataset(collapse_lab.MEASURED))
    check_04_collapse_claims(collapse_lab.view(table).to_string(), collapse_lab.sentence(table))
    with pytest.raises(AssertionError):  # the old reading: IcePop "collapsed", its spike not named apart
        check_04_collapse_claims(collapse_lab.view(table).to_string(),
                                 "Arms collapse. icepop: collapsed in 1 of 2 seeds (reward 0.83)")


def test_checklist_claim_check_needs_the_knob_where_the_line_reaches_zero():
    table = [new_output("execute_result", data={"text/plain": "knob  gap_cumulative\na  0.002\nb  0.0\nc  0.0\n"
                                                                "residual (dtype)  0.0"}, execution_count=1)]
    check_02_bf16_claims(table, "the cumulative gap reaches **0** after 2 of 3 knobs (`a`, `b`) and stays 0")
    with pytest.raises(AssertionError):
        check_02_bf16_claims(table, "the cumulative gap reaches **0** after 3 of 3 knobs (`a`, `b`, `c`)")
    with pytest.raises(AssertionError):
        check_02_bf16_claims(table, "alignment is all-or-nothing")


def check_10(nb: nbformat.NotebookNode) -> None:
    """The planted temperature bug is named with its T, the fixed run audits aligned, the bf16 engine numeric;
    each reading says what its table shows, and the growth reading's direction, noise and largest term are
    the growth table's."""
    planted = tagged(nb, "temperature-audit")
    estimate, gap, limit, _ = row(planted, "planted")
    assert has_image(planted) and "temperature" in text(planted) and abs(estimate - 0.7) < 0.05 and gap > limit
    md = markdown(tagged(nb, "temperature-reading"))
    assert f"`temperature` with T ≈ {estimate:.3f}" in md, md
    fixed = tagged(nb, "fixed-audit")
    _, gap, limit, _ = row(fixed, "fixed")
    assert has_image(fixed) and "aligned" in text(fixed).split("fixed")[-1] and gap <= limit
    assert "audit says **aligned**" in markdown(tagged(nb, "fixed-reading"))
    bf16 = tagged(nb, "bf16-audit")
    assert has_image(bf16) and "numeric" in text(bf16) and row(bf16, "bf16")[1] > row(bf16, "bf16")[2]
    md = markdown(tagged(nb, "bf16-reading"))
    assert "causes `numeric`" in md
    named = re.search(r"fingerprint names `([^`]+)` \((\d+)% of the gap", md)
    if named:  # a candidate reproduces the engine token by token, with at least REPRODUCES of the gap
        assert named.group(1) in KNOBS and REPRODUCES * 100 <= int(named.group(2)) <= 100, md
    else:  # the engine rounds in its own order: the reading is the fingerprint by size
        assert "reproduces it token by token; " in md and re.search(r"by size the gap matches|no candidate's gap", md), md
    out = tagged(nb, "growth")
    steps = [line.split()[0] for line in text(out).splitlines() if re.match(r"\d+\s+[-\d.]", line)]
    (g0, se0, *_), (g1, se1, grew, *parts) = row(out, steps[0]), row(out, steps[-1])
    assert has_image(out) and abs(sum(parts) - grew) < 1e-5 and abs(g1 - g0 - grew) < 1e-5
    terms = ("length", "low_prob", "entropy", "staleness", "within")
    md = markdown(tagged(nb, "growth-reading"))
    assert f"`{terms[max(range(5), key=lambda k: abs(parts[k]))]}` (" in md.split("largest term at the last step is")[1]
    noise = 2 * math.hypot(se0, se1)  # the table's rounding decides nothing within 2 % of the bound
    assert abs(abs(grew) - noise) < 0.02 * noise or ("inside its noise" in md) == (abs(grew) <= noise), md
    check_closing(nb, "conclusion")
    check_quiet(nb)


OUTPUT_CHECKS["10_your_run.ipynb"] = check_10


def check_11(nb: nbformat.NotebookNode) -> None:
    """Notebook 11 (TRL with the lab attached): every section plots, each reading names what its table
    shows (the bucket with the largest mean gap, the lowest ESS), and the audit names ``numeric``."""
    for tag in ("gap-by-bucket", "ratios", "monitor", "audit"):
        assert has_image(tagged(nb, tag)), tag
    lines = text([o for o in tagged(nb, "gap-by-bucket") if o.get("output_type") == "execute_result"]).splitlines()
    buckets = lines[0].split()[:-1]  # the "all" column last
    steps = [[float(x) for x in line.split()[1:]] for line in lines[2:]]  # NaN: no token in that bucket that step
    means = {b: statistics.mean(v for s in steps if not math.isnan(v := s[i])) for i, b in enumerate(buckets)}
    assert f"probability {max(means, key=means.get)[1:]};" in markdown(tagged(nb, "gap-reading"))
    ess = min(row(tagged(nb, "ratios"), str(step))[-1] for step in range(len(steps)))  # the table's 4 decimals
    said = re.search(r"\(([\d.]+)% of the sequences\)", markdown(tagged(nb, "ratio-reading")))
    assert said and abs(float(said.group(1)) / 100 - ess) <= 6e-5, (said, ess)
    assert "numeric" in text(tagged(nb, "audit"))
    assert "**misaligned**" in (md := markdown(tagged(nb, "audit-reading"))) and "Causes named: `numeric`" in md, md
    check_closing(nb, "end")


OUTPUT_CHECKS["11_inside_trl.ipynb"] = check_11


def check_12(nb: nbformat.NotebookNode) -> None:
    """Notebook 12 (the field's findings): each section plots; each reading names what its table shows (the
    setting closest to 0 and whether any held the rule; flat / grows from the slope intervals; the layer
    that flips most and the mean flip rate)."""
    for tag in ("on-policy", "lr0", "r3", "fp16"):
        assert has_image(tagged(nb, tag)), tag
    settings = tuple(on_policy_lab.SETTINGS)
    out = tagged(nb, "on-policy")
    shown = {s: row(out, s) for s in settings if f"\n{s} " in "\n" + text(out)}  # zero_steps, steps, max, mean, ...
    md = markdown(tagged(nb, "on-policy-reading"))
    assert f"The closest is `{min(shown, key=lambda s: shown[s][2])}`" in md, md
    assert ("No setting holds the rule" in md) == all(v[0] < v[1] for v in shown.values()), md
    slopes, md = tagged(nb, "lr0"), markdown(tagged(nb, "lr0-reading"))
    (_, low0, high0), (_, low1, _) = row(slopes, "lr0"), row(slopes, "normal")
    assert ("**flat**" in md) == (low0 <= 0 <= high0) and ("**grows**" in md) == (low1 > 0), md
    flips = tagged(nb, "r3")
    rates = {int(line.split()[0]): float(line.split()[1]) for line in text(flips).splitlines()
             if re.match(r"\d+\s+[\d.]+$", line.strip())}
    md = markdown(tagged(nb, "r3-reading"))
    top = max(rates, key=rates.get)
    assert f"highest at layer {top} ({rates[top]:.1%})" in md, md
    said = float(re.search(r"the layers flip at ([\d.]+)% on average", md).group(1)) / 100
    assert abs(said - statistics.mean(rates.values())) <= 5e-4 + 1e-6, (said, rates)
    rl = {d: row(tagged(nb, "fp16"), d) for d in ("float16", "bfloat16")}  # mismatch, slope, reward, accuracy
    md = markdown(tagged(nb, "fp16-reading"))
    ratio = rl["float16"][0] / rl["bfloat16"][0]
    said = float(re.search(r"fp16/bf16 = (\d+\.\d+)", md).group(1))
    assert abs(said - ratio) <= 0.005 + 1e-3 * ratio, (md, rl)  # printed to 2 decimals; the table to 6 digits
    assert not ("**fp16 keeps the mismatch down**" in md and ratio >= 0.5), md
    assert f"fp16 {rl['float16'][3]:.2f}, bf16 {rl['bfloat16'][3]:.2f}" in md, (md, rl)
    check_closing(nb, "conclusion")
    check_quiet(nb)


OUTPUT_CHECKS["12_field_findings.ipynb"] = check_12
