"""``make demo``'s report: every banner carries its numbers, the real-vLLM fingerprint is a table
(hand-made gates and fingerprints: the real ones take minutes and a vLLM build)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from aligntools.viz.report import Report
from labs.demo import banner, vllm_section


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
    assert text.endswith("2 of 2 sites within their limits.")  # the n/a expert-id row is not a site verdict
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
