"""``mlab diff a b`` names the captures in the order typed and keeps its FAIL line short."""

from __future__ import annotations

import re

import pytest

from aligntools import Capture
from labs.cli import main as mlab
from tests.aligntools.analyzer.analyzer_synth import downstream, make_capture, noise


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A trusted capture and one whose every float site from embed on is 1% off."""
    d = tmp_path_factory.mktemp("diff_order")
    a = make_capture(n_layers=3, moe_layers=(1,))
    bad = noise(a, {s: 1e-2 for s in downstream("embed", a)})
    return str(Capture(a).save(d / "trusted.zarr")), str(Capture(bad).save(d / "candidate.zarr"))


@pytest.mark.parametrize("swap", [False, True])
def test_header_reads_a_vs_b_in_the_order_typed(files, capsys, swap):
    first, second = files[::-1] if swap else files
    assert mlab(["diff", first, second]) == 1
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith(f"{first} vs {second}:"), header


def test_fail_line_names_eight_sites_and_counts_the_rest(files, capsys):
    assert mlab(["diff", *files]) == 1
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines() if re.match(r"^(embed|L\d+\.\w+|final_norm|logits|logprobs|entropy)\s", line)]
    failing = [row[0] for row in table if row[-1] == "False"]
    assert len(failing) > 20  # the table lists every failing site
    last = out.rstrip().splitlines()[-1]
    m = re.fullmatch(r"FAIL at (\d+) sites: (.*), and (\d+) more", last)
    assert m, last
    named = m.group(2).split(", ")
    assert int(m.group(1)) == len(failing) and named == failing[:8] and int(m.group(3)) == len(failing) - 8
