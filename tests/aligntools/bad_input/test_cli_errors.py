"""Every expected failure of mlab capture / check is exit 2 with one line naming the problem.

All of these are rejected before a model is loaded or an output is opened, so each case is
fast and leaves nothing at ``--out``.
"""

from __future__ import annotations

import shutil

import pytest


def _copy(src, dest):
    shutil.copytree(src, dest)
    return dest


@pytest.mark.parametrize("args,message", [
    (["--dtype", "float17", "--text", "hi"], "--dtype float17 with --engine hf: 'float17' is not a hf dtype"),
    (["--text", ""], "--text gives no tokens"),
    (["--text", "a b " * 50_000], "over the model's max_position_embeddings 512"),
    (["--ids", "[[5.0, 6.7]]"], "token ids must be integers; request 0 position 0 is 5.0"),
    (["--ids", "[[[5, 6]]]"], "token ids must be integers; request 0 position 0 is [5, 6]"),
    (["--ids", '[["a", "b"]]'], 'token ids must be integers; request 0 position 0 is "a"'),
    (["--ids", "[[5, 6, 99999]]"], "token id 99999 (request 0, position 2) is outside the model's vocabulary"),
    (["--ids", "[[5, -1]]"], "token id -1"),
    (["--ids", "[[5, 6], [7]]"], "equal-length"),
    (["--ids", "{}"], "expected a JSON list of token-id lists"),
    (["--ids", "[[5, 6"], "not JSON"),
    (["--engine", "minirl,tp=abc", "--text", "hi"], "knob tp expects"),
    (["--engine", "hf:float17", "--text", "hi"], "'float17' is not a hf dtype (float32, bfloat16, float16, float64)"),
])
def test_capture_input_errors(llama, tmp_path, mlab, args, message):
    if args[0] == "--ids":
        (tmp_path / "ids.json").write_text(args[1])
        args = ["--ids", tmp_path / "ids.json"]
    code, out, err = mlab("capture", "--model", llama, *args, "--out", tmp_path / "c.nc")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "c.nc").exists() and not (tmp_path / ".c.nc.partial").exists()


@pytest.mark.parametrize("engine", ["hf", "minirl"])
@pytest.mark.parametrize("breakage,message", [
    ("config_list", "config.json holds a list"),
    ("config_truncated", "config.json"),
    ("config_fields", "no integer 'hidden_size'"),
    ("weights_truncated", "model.safetensors"),
    ("weights_random", "model.safetensors"),
])
def test_broken_checkpoints(llama, tmp_path, mlab, engine, breakage, message):
    bad = _copy(llama, tmp_path / "ckpt")
    weights = bad / "model.safetensors"
    if breakage == "config_list":
        (bad / "config.json").write_text("[]")
    elif breakage == "config_truncated":
        (bad / "config.json").write_text((bad / "config.json").read_text()[:30])
    elif breakage == "config_fields":
        (bad / "config.json").write_text('{"model_type": "llama", "vocab_size": 512}')
    elif breakage == "weights_truncated":
        weights.write_bytes(weights.read_bytes()[:300_000])
    else:
        weights.write_bytes(bytes(range(256)) * 40)
    code, _, err = mlab("capture", "--model", bad, "--engine", engine, "--text", "hi", "--out", tmp_path / "c.nc")
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_check_refuses_a_token_count_past_the_model_positions(llama, mlab):
    code, _, err = mlab("check", "--model", llama, "--tokens", 100_000_000)
    assert code == 2 and "max_position_embeddings 512" in err and "--tokens 2048" in err


def test_check_with_a_list_config_is_one_line(llama, tmp_path, mlab):
    bad = _copy(llama, tmp_path / "ckpt")
    (bad / "config.json").write_text("[]")
    code, _, err = mlab("check", "--model", bad)
    assert code == 2 and len(err.splitlines()) == 1 and "config.json" in err


def test_an_unexpected_error_is_one_line_too(llama, tmp_path, mlab, monkeypatch):
    import aligntools.cli.capture as cli_capture

    def boom(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(cli_capture, "_input_ids", boom)
    code, _, err = mlab("capture", "--model", llama, "--text", "hi", "--out", tmp_path / "c.nc")
    assert code == 2 and err == "mlab capture: error: ZeroDivisionError: planted (set MLAB_DEBUG=1 for the traceback)"



def test_mlab_debug_adds_the_traceback_not_another_exit_code(llama, tmp_path, monkeypatch, capsys):
    """A CI script reads exit 1 as "misaligned": asking for a traceback must not turn a crash into that."""
    import aligntools.cli.capture as cli_capture
    from labs.cli import main

    def boom(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(cli_capture, "_input_ids", boom)
    monkeypatch.setenv("MLAB_DEBUG", "1")
    code = main(["capture", "--model", str(llama), "--text", "hi", "--out", str(tmp_path / "c.nc")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and "ZeroDivisionError: planted" in err
    assert err.strip().splitlines()[-1] == "mlab capture: error: ZeroDivisionError: planted (set MLAB_DEBUG=1 for the traceback)"
