"""``mlab check``: aligned engines pass (exit 0), typical bf16 engines fail (exit 1) and say
why in the terminal and in the HTML report; usage errors exit 2."""

from __future__ import annotations

import pytest

from labs.cli import main

TOKENS = ["--tokens", "96"]


def test_aligned_fp32_engine_passes_and_writes_the_report(moe, tmp_path, capsys):
    report = tmp_path / "aligned.html"
    assert main(["check", "--model", str(moe), "--infer", "minirl:aligned", "--dtype", "float32",
                 *TOKENS, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "ALIGNED: minirl:aligned:float32 vs hf:float32" in out and "FAIL" not in out
    html = report.read_text()
    assert "<table>" in html and "L3.resid_post" in html and "data:image/png;base64," in html
    assert 'class="verdict pass"' in html


def test_typical_bf16_engine_fails_and_says_why(moe, tmp_path, capsys):
    report = tmp_path / "typical.html"
    assert main(["check", "--model", str(moe), "--infer", "minirl", *TOKENS, "--report", str(report)]) == 1
    out = capsys.readouterr().out
    verdict = out.strip().splitlines()[-2]  # last line is "report: PATH"
    assert verdict.startswith("MISALIGNED: minirl:typical:bfloat16 vs hf:float32")
    assert "mean |Δ logprob|" in verdict and "first divergence at" in out
    html = report.read_text()
    assert 'class="verdict failv"' in html and '<tr class="fail">' in html and "L0.attn_norm" in html


def test_one_divergent_knob_on_an_aligned_engine_fails(moe, capsys):
    assert main(["check", "--model", str(moe), "--infer", "minirl:aligned,rmsnorm=bf16_compute", *TOKENS]) == 1
    out = capsys.readouterr().out
    assert "first divergence at L0.attn_norm" in out and "rmsnorm_precision" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "/nonexistent/model"], "does not exist"),
    (["--infer", "minirl:aligned,not_a_knob=1"], "unknown knob"),
    (["--infer", "minirl:fastest"], "'fastest' is not a minirl preset or dtype"),
    (["--train", "hf:int8"], "'int8' is not a hf dtype"),
    (["--tokens", "3"], "--tokens"),
    (["--train", "minirl"], "--train must be hf"),
    (["--infer", "hf:bfloat16"], "--infer must be minirl"),
])
def test_usage_errors_exit_2(moe, argv, message, capsys):
    args = ["check", "--model", str(moe), *argv] if argv[0] != "--model" else ["check", *argv]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_unreadable_checkpoint_exits_2(corrupt_checkpoint, capsys):
    assert main(["check", "--model", str(corrupt_checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "unreadable checkpoint" in err and "model.safetensors" in err


def test_unwritable_report_exits_2_after_printing_the_verdict(moe, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "r.html"
    assert main(["check", "--model", str(moe), "--infer", "minirl:aligned", *TOKENS, "--report", str(bad)]) == 2
    captured = capsys.readouterr()
    assert "ALIGNED" in captured.out and str(bad) in captured.err


def test_tolerance_file_overrides_the_limits(moe, tmp_path, capsys):
    loose = tmp_path / "loose.json"
    loose.write_text('{"default": {"atol": 1.0}}')
    main(["check", "--model", str(moe), "--infer", "minirl", *TOKENS, "--tolerance", str(loose)])
    out = capsys.readouterr().out
    assert "sites over their limit" not in out  # every site within atol 1.0 now
    assert "MISALIGNED" in out  # the final logprob check still holds the line


def test_hf_spec_takes_the_attention_kernel_and_hf_exact_follows_it(moe):
    """Stock transformers runs sdpa: hf_exact against the default trainer must pick sdpa too."""
    from aligntools import check_alignment

    default = check_alignment(moe, train="hf:bfloat16", infer="minirl:hf_exact", dtype="bfloat16", tokens=64,
                              progress=False)
    assert default.setup["train_kernels"]["attn"] == "sdpa" and default.setup["knobs"]["attention"] == "sdpa"
    assert default.logprob.loc["max", "value"] == 0.0  # bit-exact against the stock (sdpa) trainer
    eager = check_alignment(moe, train="hf:bfloat16,attn=eager", infer="minirl:hf_exact", dtype="bfloat16",
                            tokens=64, progress=False)
    assert eager.setup["train"] == "hf:bfloat16,attn=eager" and eager.setup["knobs"]["attention"] == "eager"
    assert eager.logprob.loc["max", "value"] == 0.0


def test_overrides_show_in_the_label_and_bad_hf_options_are_usage_errors(moe, capsys):
    from aligntools.gates.inputs import parse_infer

    assert parse_infer("minirl:typical,rmsnorm=hf", None).label == "minirl:typical,rmsnorm=hf:bfloat16"
    assert main(["check", "--model", str(moe), "--train", "hf,attn=flash", "--tokens", "32"]) == 2
    assert "hf option attn='flash'; valid values: eager, sdpa" in capsys.readouterr().err


def test_config_claiming_more_layers_than_the_weights_hold_is_refused(moe, tmp_path, capsys):
    import json
    import shutil

    bad = tmp_path / "six_layers"
    shutil.copytree(moe, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 6}))
    assert main(["check", "--model", str(bad), "--tokens", "32"]) == 2
    assert "num_hidden_layers=6 but the weights hold 4 layers" in capsys.readouterr().err
