"""``mlab audit``: exit 0 aligned, 1 a cause (named first on the verdict line), 2 usage error; --json keys,
--report page."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from aligntools.audit.planted import plant
from aligntools.records import write_jsonl


@pytest.fixture
def mlab(capsys):
    """``mlab(*args) -> (exit code, stdout, stderr lines that mlab wrote)``, run in process."""
    from labs.cli import main

    def run(*args) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, "\n".join(line for line in err.splitlines() if line.startswith("mlab"))

    return run


def test_planted_temperature_exit_1_and_json(llama, llama_model, tmp_path, mlab):
    planted = plant(llama_model, "temperature")
    records = write_jsonl(planted.records, tmp_path / "r.jsonl")
    code, out, err = mlab("audit", records, "--model", llama, "--json", tmp_path / "a.json",
                          "--report", tmp_path / "a.html")
    assert code == 1, err
    assert out.startswith("misaligned: temperature (T 0.7")
    page = (tmp_path / "a.html").read_text()
    assert "<h1 class='misaligned'>misaligned: temperature" in page and "<script" not in page
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["verdict"] == "misaligned"
    assert set(report["causes"][0]) >= {"name", "estimate", "share"}
    assert report["causes"][0]["name"] == "temperature" and report["causes"][0]["share"] > 0.5


def test_clean_records_exit_0(llama, llama_model, tmp_path, mlab):
    records = write_jsonl(plant(llama_model, "clean").records, tmp_path / "r.jsonl")
    code, out, _ = mlab("audit", records, "--model", llama)
    assert code == 0 and out.startswith("aligned:")


def test_slime_and_verl_dumps_name_the_planted_cause(llama, llama_model, tmp_path, mlab):
    """Hand-made slime (--save-debug-rollout-data) and verl (batch dict) files of a top-k engine, both given at once."""
    recs = plant(llama_model, "top_k").records
    half = len(recs) // 2
    torch.save({"rollout_id": 0, "samples": [
        {"tokens": [*r.prompt_ids, *r.completion_ids], "response_length": len(r.completion_ids),
         "rollout_log_probs": list(r.logprobs), "status": "completed"} for r in recs[:half]]}, tmp_path / "slime_0.pt")
    rest = recs[half:]
    np.savez(tmp_path / "verl.npz", prompts=np.array([r.prompt_ids for r in rest]),
             responses=np.array([r.completion_ids for r in rest]),
             attention_mask=np.ones((len(rest), len(rest[0].prompt_ids) + len(rest[0].completion_ids)), dtype=np.int64),
             rollout_log_probs=np.array([r.logprobs for r in rest], dtype=np.float32))
    code, out, err = mlab("audit", tmp_path / "slime_0.pt", tmp_path / "verl.npz", "--model", llama)
    assert code == 1, err
    assert out.startswith("misaligned: top_k (k 20)")


@pytest.mark.parametrize("case,message", [
    ("missing", "no such file"),
    ("vocab", "outside the model's vocabulary of 512"),
    ("model", "model path"),
    ("json_dir", "--json"),
    ("report_dir", "--report"),
])
def test_usage_errors_exit_2_with_one_line(llama, tmp_path, mlab, case, message):
    records = tmp_path / "r.jsonl"
    ids = [9999] if case == "vocab" else [5]
    records.write_text(json.dumps({"prompt_ids": [1, 4], "completion_ids": ids, "logprobs": [-1.0]}) + "\n")
    args = {"missing": [tmp_path / "nope.jsonl", "--model", llama],
            "vocab": [records, "--model", llama],
            "model": [records, "--model", tmp_path / "no-model"],
            "json_dir": [records, "--model", llama, "--json", tmp_path / "no" / "a.json"],
            "report_dir": [records, "--model", llama, "--report", tmp_path / "no" / "a.html"]}[case]
    code, out, err = mlab("audit", *args)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert message in err
    if case.endswith("_dir"):
        assert "does not exist; create it first" in err


def test_progress_bars_go_to_stderr_and_stdout_keeps_the_verdict(llama, llama_model, tmp_path, capsys):
    """A 64 x 256 audit of smollm2 takes minutes: ``mlab audit`` shows where it is (the trainer's forward
    per record, each round of causes, the fingerprint's candidates) on stderr, so stdout stays the verdict
    a CI script parses."""
    from labs.cli import main

    records = write_jsonl(plant(llama_model, "bf16", n=3).records, tmp_path / "r.jsonl")
    assert main(["audit", str(records), "--model", str(llama)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("misaligned: numeric") and "trainer forward" not in out and "%|" not in out
    assert "trainer forward: 100%" in err and "3/3" in err, err[-2000:]
    assert "fingerprint: 100%" in err and "causes, round 1" in err
