"""The ``mlab`` entry point: zoo subcommands and usage-error exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from labs.cli import SUBCOMMANDS, build_parser, main


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


def test_console_script_is_installed_and_zoo_list_does_not_wait_for_torch():
    code = ("import sys; from labs.cli import main; rc = main(['zoo', 'list']); "
            "print('heavy:', sorted(m for m in ('torch', 'transformers') if m in sys.modules)); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "tiny-mixtral" in r.stdout and "smollm2-135m" in r.stdout, r.stderr
    assert "heavy: []" in r.stdout


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_each_command_is_registered_by_the_module_it_is_mapped_to(command):
    """Only the named command's module is imported, so the table must name the right one."""
    parser = build_parser([command])
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == [command]


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(command in out for command in SUBCOMMANDS)


def test_the_usage_of_every_command_imports_neither_torch_nor_transformers():
    """``mlab --help`` registers every command; a fresh interpreter doing so must not import torch,
    transformers or matplotlib (``aligntools._lazy``: eager re-exports made it take 6.5 s, now ~1.4 s)."""
    heavy = ("torch", "transformers", "matplotlib")
    code = ("import sys; from labs.cli import build_parser; build_parser(['--help']); "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"imported at usage time: {out}"


def test_a_mistyped_check_model_is_named_before_the_gates_imports(tmp_path):
    """``mlab check --model TYPO`` exits 2 naming the path without importing pandas, xarray or matplotlib
    (the gate's imports: ~4 of the ~9 s the answer took; ``aligntools.gates`` is lazy)."""
    heavy = ("pandas", "xarray", "matplotlib")
    code = (f"import sys; from labs.cli import main; rc = main(['check', '--model', {str(tmp_path / 'typo')!r}]); "
            f"print(rc, [m for m in {heavy!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "2 []", proc.stdout
    assert f"model path {tmp_path / 'typo'} does not exist" in proc.stderr
