"""``make demo``'s report: every banner carries its numbers, the real-vLLM fingerprint is a table
(hand-made gates and fingerprints: the real ones take minutes and a vLLM build), and ``mlab check``'s
ALIGNED line and report banner carry them too (a real gate on the tiny MoE, 32 tokens)."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

import pandas as pd

from aligntools.viz.report import Report
from labs.demo import banner, fingerprint_line, vllm_section


def gate(passed: bool) -> SimpleNamespace:
    logprob = pd.DataFrame({"value": [0.0038, 0.05], "noise_floor": [0.002, 0.01], "limit": [0.0045, 0.025],
                            "passes": [True, True]}, index=pd.Index(["mean", "max"], name="stat"))
    routing = pd.DataFrame({"set_flip": [0.004, 0.016], "allowed": [0.02, 0.021], "passes": [True, True]},
                           index=pd.Index([0, 1], name="layer"))
    table = pd.DataFrame({"dtype": ["bfloat16"] * 3, "rel_l2": [0.01, float("nan"), 0.02], "passes": [True, True, True]},
                         index=["L0.q", "L0.topk_ids", "logits"])
    return SimpleNamespace(passed=passed, logprob=logprob, routing=routing, table=table,
                           verdict="ALIGNED: minirl vs hf:bfloat16" if passed else "MISALIGNED: minirl vs hf - mean over")


def test_the_aligned_banner_states_the_gap_the_limit_and_why_it_holds():
    text = banner(gate(True))
    assert text.startswith("ALIGNED: minirl vs hf:bfloat16. Mean |Δ logprob| 0.0038 is within its limit 0.0045 = ")
    assert "2 x the trainer's own gap to a float64 run of the same model (0.002) + 0.0005 for bfloat16 rounding" in text
    assert "At most 1.6% of tokens change top-k experts (layer 1; allowed 2.1%)." in text
    # the n/a expert-id row is not a site verdict: "53 of 53 sites compared" above, 49 judged by their error
    assert text.endswith("2 of 2 sites within their limits (the other 1 compared, expert ids, are judged by their "
                         "flips).")
    still = gate(True)
    still.routing["set_flip"] = 0.0
    assert "No token changes its top-k experts (allowed up to 2.0% per layer)." in banner(still)


def test_the_misaligned_banner_is_the_verdict_that_already_quotes_its_limits():
    assert banner(gate(False)) == "MISALIGNED: minirl vs hf - mean over"


def test_real_vllm_renders_its_banner_and_fingerprint_as_tables_not_a_repr():
    fp = SimpleNamespace(distance=0.041, gap_start="embed", evaluated=23,
                         explained=pd.DataFrame({"engine_value": ["sdpa"], "trainer_value": ["eager"],
                                                 "distance_if_reverted": [0.05]}, index=["attention"]),
                         table=pd.DataFrame({"hf_exact": [0.02], "typical": [0.03], "best": [0.01]}, index=["embed"]))
    r = Report("t")
    vllm_section(r, gate(True), fp, ["ALIGNED", "mean |Δ logprob| 0.0038 (max 0.05)", "first divergence: embed (x3)",
                                     "Fingerprint(distance=0.041 ...)"])
    html = r.render()
    assert 'class="verdict pass">ALIGNED: minirl vs hf:bfloat16. Mean |Δ logprob| 0.0038' in html
    assert "<td><code>attention</code></td><td>sdpa</td><td>eager</td>" in html and "Fingerprint(" not in html
    skipped = Report("t")
    vllm_section(skipped, None, None, ["skipped: no vLLM here"])
    assert "<p>skipped: no vLLM here</p>" in skipped.render()


def test_a_trainer_that_matches_float64_exactly_leaves_the_rounding_allowance_as_the_limit():
    exact = gate(True)
    exact.logprob["noise_floor"] = 0.0
    exact.logprob["limit"] = 0.0005
    text = banner(exact)
    assert "within its limit 0.0005 = 0.0005 for bfloat16 rounding alone (the trainer matches a float64 run" in text
    assert " 0 x " not in text


def test_the_real_vllm_fingerprint_prints_as_a_sentence_not_a_repr():
    fp = SimpleNamespace(distance=0.00598, gap_start="L0.q", evaluated=36,
                         explained=pd.DataFrame({"engine_value": ["float32", "topk_slot"]},
                                                index=["lm_head_dtype", "expert_sum_order"]),
                         table=pd.DataFrame({"best": [0.0038]}, index=["L0.q"]))
    assert fingerprint_line(fp) == ("fingerprint: the closest minirl setting (36 tried) is 0.00598 mean |Δ logprob| "
                                    "from vLLM; it differs from hf_exact in lm_head_dtype=float32, "
                                    "expert_sum_order=topk_slot; the rest of the gap starts at L0.q (rel-L2 0.0038)")
    same = SimpleNamespace(**(vars(fp) | {"gap_start": None, "explained": fp.explained.iloc[:0]}))
    assert fingerprint_line(same).endswith("it is hf_exact itself; no site diverges past that")


def test_mlab_check_ends_with_the_aligned_banner_and_its_report_shows_it(zoo, tmp_path, capsys):
    """``mlab check``'s ALIGNED line and its report's banner carry the gap, the limit and why (issue 66)."""
    from labs.cli import main

    report = tmp_path / "aligned.html"
    assert main(["check", "--model", str(zoo("tiny-qwen3-moe")), "--infer", "minirl:aligned", "--dtype", "float32",
                 "--tokens", "32", "--report", str(report)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    line = next(x for x in reversed(lines) if x.startswith("ALIGNED: "))
    head = re.match(r"ALIGNED: minirl:aligned:float32 vs hf:float32\. Mean \|Δ logprob\| (\S+) is within its limit "
                    r"(\S+) = ", line)
    assert head and float(head[1]) <= float(head[2]), line
    assert ("x the trainer's own gap to a float64 run of the same model (" in line and "+ 1e-05 for float32 rounding: "
            "no engine can be expected closer to the trainer than the trainer is to float64" in line) or \
        "1e-05 for float32 rounding alone" in line, line
    assert re.search(r"\. (At most \S+ of tokens change top-k experts \(layer \d+; allowed \S+\)|No token changes "
                     r"its top-k experts \(allowed up to \S+ per layer\))\. (\d+) of \2 sites within their limits "
                     r"\(the other 4 compared, expert ids, are judged by their flips\)\.$",
                     line), line
    assert html.escape(line) in report.read_text()  # the report's banner is the same line


def test_the_diagnosis_links_to_the_drill_down_only_when_a_drill_ran():
    """The demo runs no drill: its report's diagnosis promised "the first divergent op" behind a link to a
    section that held only a hint (issue 66)."""
    from aligntools.drilldown.gate import ANCHOR, diagnosis_link

    assert f'href="#{ANCHOR}"' not in diagnosis_link(Report("t"), SimpleNamespace(drilldown=None)).render()
    drilled = SimpleNamespace(drilldown=SimpleNamespace(site="L2.mlp_out"))
    assert f'<a href="#{ANCHOR}">Drill-down: the ops inside L2.mlp_out' in diagnosis_link(Report("t"), drilled).render()


def test_a_hint_section_takes_no_anchor_so_two_blocks_never_repeat_an_id(monkeypatch):
    """The demo's bf16-trainer block adds a second drill-down section: as a hint (no drill ran, no link
    points at it) it carries no ``id``, so the page holds no repeated id."""
    from aligntools.drilldown import gate as drill_gate

    monkeypatch.setattr(drill_gate, "hint", lambda gate: "drill-down: the ops inside L1.mlp_out: ...")
    r = Report("t")
    for _ in range(2):
        drill_gate.report_section(r, SimpleNamespace(drilldown=None))
    page = r.render()
    assert page.count("Drill-down: the first divergent op") == 2 and f'id="{drill_gate.ANCHOR}"' not in page
