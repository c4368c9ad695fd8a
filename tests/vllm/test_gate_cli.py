"""``mlab check --infer vllm:float32|bfloat16``: the alignment gate on the real engine, with the
vLLM version and settings in the report."""

from __future__ import annotations

from labs.cli import main
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm


def test_vllm_fp32_is_aligned_and_bf16_is_not(zoo, tmp_path, capsys):
    path = zoo("tiny-qwen3-moe")
    report = tmp_path / "vllm.html"
    assert main(["check", "--model", str(path), "--infer", "vllm:float32", "--tokens", "64",
                 "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "ALIGNED: vllm:float32 vs hf:float32" in out
    assert "vllm_version" in report.read_text()
    assert main(["check", "--model", str(path), "--infer", "vllm:bfloat16", "--tokens", "64"]) == 1
    assert "MISALIGNED: vllm:bfloat16 vs hf:float32" in capsys.readouterr().out


def test_unknown_vllm_option_is_a_usage_error(zoo, capsys):
    assert main(["check", "--model", str(zoo("tiny-qwen3-moe")), "--infer", "vllm:float32,tp=2"]) == 2
    assert "unknown vllm option 'tp'" in capsys.readouterr().err
