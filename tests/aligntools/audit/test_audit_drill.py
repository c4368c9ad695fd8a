"""``mlab audit --drill``: a numeric gap is drilled with the engine the replay ran, into the site the
replay picked, with every op held to float32's limits; what cannot be drilled says why in one line."""

from __future__ import annotations

import json

import pytest

from aligntools.audit.drill import drill_numeric
from aligntools.audit.planted import plant
from aligntools.audit.report import render
from aligntools.audit.result import AuditResult, Cause
from aligntools.drilldown.gate import drillable
from aligntools.records import write_jsonl
from labs.cli import main


def _audit(args: list, capsys) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def test_a_bf16_engine_is_drilled_with_the_replayed_spec(llama, llama_model, tmp_path, capsys):
    records = write_jsonl(plant(llama_model, "bf16", n=4).records, tmp_path / "r.jsonl")
    code, out = _audit(["audit", records, "--model", llama, "--drill", "--json", tmp_path / "a.json",
                        "--report", tmp_path / "a.html"], capsys)
    assert code == 1
    numeric = next(c for c in json.loads((tmp_path / "a.json").read_text())["causes"] if c["name"] == "numeric")
    replayed, drilled = numeric["detail"]["replay"], numeric["detail"]["drill"]
    assert replayed["engine"].startswith("minirl:hf_exact") and drillable(drilled["site"])
    assert f"drill-down with {replayed['engine']}, into {drilled['site']}" in out
    assert f"drill-down of {drilled['site']}: " in out  # the op table follows
    # the trainer's limits, as the replay's: float32's 9e-06 per op, not bfloat16's 0.049
    assert " 9e-06 " in out and " 0.049 " not in out, out
    assert f"Drilled into <b>{drilled['site']}</b>" in (tmp_path / "a.html").read_text()


def test_a_gap_that_starts_at_the_logits_says_there_is_no_module_to_drill(llama, llama_model, tmp_path, capsys):
    records = write_jsonl(plant(llama_model, "bf16_lm_head", n=2).records, tmp_path / "r.jsonl")
    code, out = _audit(["audit", records, "--model", llama, "--drill"], capsys)
    assert code == 1
    assert "drill-down: replayed as minirl:hf_exact,lm_head_dtype=bfloat16,dtype=float32, no layer's attention or " \
           "MLP fails (first divergent site logits)" in out, out


def test_aligned_records_have_nothing_to_drill(llama, llama_model, tmp_path, capsys):
    records = write_jsonl(plant(llama_model, "clean", n=2).records, tmp_path / "r.jsonl")
    code, out = _audit(["audit", records, "--model", llama, "--drill"], capsys)
    assert code == 0 and out.splitlines()[-1] == "drill-down: nothing to drill, the records are aligned"


@pytest.mark.parametrize("replay, line", [
    (None, "no precision choice minirl computes"),
    ({"engine": "minirl:hf_exact,dtype=bfloat16", "error": "GPT2 is not implemented"}, "minirl cannot run this model"),
])
def test_no_engine_to_drill_is_one_line_and_the_report_says_so(replay, line):
    result = AuditResult("misaligned", (Cause("numeric", 0.01, 1.0, "nats", "fix", {"replay": replay}),),
                         0.01, 1e-5, 2e-5, 8, 1)
    assert line in drill_numeric(result, "unused") and "\n" not in drill_numeric(result, "unused")
    page = render(result)
    assert ("could not replay this model" in page) == (replay is not None)
