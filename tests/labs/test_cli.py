"""The ``mlab`` entry point: zoo subcommands and usage-error exit codes."""

from __future__ import annotations

import subprocess
import sys

from labs.cli import main


def test_zoo_list_prints_every_model(capsys):
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("tiny-llama", "tiny-qwen3-moe", "tiny-ring-linear"):
        assert name in out


def test_zoo_build_prints_the_checkpoint(tmp_path, capsys, short_zoo_recipe):
    short_zoo_recipe("tiny-qwen3")
    assert main(["zoo", "build", "tiny-qwen3", "--out", str(tmp_path / "m"), "--seed", "1"]) == 0
    assert str(tmp_path / "m") in capsys.readouterr().out
    assert (tmp_path / "m" / "model.safetensors").exists()


def test_unknown_zoo_name_is_usage_error(capsys):
    assert main(["zoo", "build", "nope"]) == 2
    assert "valid names" in capsys.readouterr().err


def test_console_script_is_installed():
    r = subprocess.run([sys.executable, "-m", "labs.cli", "zoo", "list"], capture_output=True, text=True)
    assert r.returncode == 0 and "tiny-mixtral" in r.stdout
