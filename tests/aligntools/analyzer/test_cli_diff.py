"""``mlab diff``: printed report and CI exit codes."""

from __future__ import annotations

import argparse

import pytest

from aligntools import Capture
from aligntools.cli.diff import register
from labs.cli import main as mlab


def main(argv: list[str]) -> int:
    """``mlab diff ARGV``: the one entry point."""
    return mlab(["diff", *argv])
from tests.aligntools.analyzer.analyzer_synth import downstream, noise


@pytest.fixture(scope="module")
def files(synth, tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")  # zarr: the venv has no h5py for netCDF
    bad = noise(synth, {s: 1e-3 for s in downstream("L2.attn_norm", synth)})
    return {name: Capture(ds).save(d / f"{name}.zarr") for name, ds in (("a", synth), ("bad", bad))}


def test_identical_captures_exit_0(files, capsys):
    assert main([str(files["a"]), str(files["a"])]) == 0
    out = capsys.readouterr().out
    assert "no divergence" in out and out.rstrip().endswith("PASS") and "L2.attn_norm" in out


@pytest.mark.parametrize("budget", [[], ["--max-memory", "1"]])  # 1 MiB: many small tiles from disk
def test_divergent_capture_exits_1_with_first_divergence(files, capsys, budget):
    assert main([str(files["a"]), str(files["bad"]), "--sites", "L2.*,final_norm", *budget]) == 1
    out = capsys.readouterr().out
    assert "first divergence at L2.attn_norm" in out and "rmsnorm" in out and "L1." not in out


def test_usage_errors_exit_2(files, tmp_path, capsys):
    assert main([str(files["a"]), str(tmp_path / "missing.nc")]) == 2
    assert "missing.nc" in capsys.readouterr().err
    (tmp_path / "junk.nc").write_text("not a capture")
    assert main([str(files["a"]), str(tmp_path / "junk.nc")]) == 2
    with pytest.raises(SystemExit) as e:
        main([str(files["a"])])
    assert e.value.code == 2


def test_register_adds_diff_subcommand():
    parser = argparse.ArgumentParser(prog="mlab")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diff", "x.nc", "y.nc", "--align", "prefix", "--tolerance", "t.json"])
    assert (args.a, args.b, args.align, args.tolerance) == ("x.nc", "y.nc", "prefix", "t.json")
    assert callable(args.func)
