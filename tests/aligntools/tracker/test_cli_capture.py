"""``mlab capture`` and the engine-spec grammar it shares with ``mlab check``."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from aligntools import Capture
from aligntools.cli.capture import register
from minirl import EngineSpec


@pytest.mark.parametrize("spec, expected", [
    ("hf", ("hf", None, None, {})),
    ("hf:bfloat16", ("hf", "bfloat16", None, {})),
    ("minirl", ("minirl", None, None, {})),
    ("minirl:aligned", ("minirl", None, "aligned", {})),
    ("minirl:typical", ("minirl", None, "typical", {})),
    ("minirl:hf_exact", ("minirl", None, "hf_exact", {})),
    ("minirl:float32", ("minirl", "float32", None, {})),
    ("minirl,rmsnorm=hf", ("minirl", None, None, {"rmsnorm": "hf"})),
    ("minirl:aligned,rmsnorm=fused_add", ("minirl", None, "aligned", {"rmsnorm": "fused_add"})),
    ("minirl:tp=2,batch_invariant=true,rmsnorm_eps=none",
     ("minirl", None, None, {"tp": 2, "batch_invariant": True, "rmsnorm_eps": None})),
    ("minirl:aligned,rmsnorm_eps=1e-5", ("minirl", None, "aligned", {"rmsnorm_eps": 1e-5})),
])
def test_parse_engine_spec(spec, expected):
    assert EngineSpec.parse(spec) == EngineSpec(*expected)


@pytest.mark.parametrize("spec, message", [
    ("tgi", "unknown engine .tgi."),
    ("vllm,gpu_layers=2", "unknown vllm option .gpu_layers."),
    ("minirl:fast", "'fast' is not a minirl preset or dtype \\(aligned, typical, hf_exact, float32"),
    ("minirl:aligned,rmsnrom=hf", "unknown knob 'rmsnrom'; valid knobs: rmsnorm"),
    ("minirl:tp=two", "knob tp expects"),
    ("minirl:batch_invariant=maybe", "is a bool"),
    ("hf:rmsnorm=hf", "unknown hf option .rmsnorm.; valid options: attn=eager|sdpa"),
])
def test_parse_engine_spec_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        EngineSpec.parse(spec)


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mlab")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_capture_cli_ids_and_text(zoo, tmp_path, capsys):
    model = zoo("tiny-llama")
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[5, 6, 7, 8], [9, 10, 11, 12]]))
    out = tmp_path / "cap.zarr"
    assert run_cli(["capture", "--model", str(model), "--engine", "minirl:aligned", "--ids", str(ids),
                    "--sites", "L*.resid_post,logits", "--mode", "stats", "--out", str(out)]) == 0
    cap = Capture.load(out)
    assert cap.engine == "minirl" and cap.mode == "stats" and cap.complete
    assert cap.sites == [f"L{i}.resid_post" for i in range(4)] + ["logits"]
    assert cap.knobs["rmsnorm"] == "hf"
    np.testing.assert_array_equal(cap.dataset["token_id"].values, [5, 6, 7, 8, 9, 10, 11, 12])
    out2 = tmp_path / "text.zarr"
    assert run_cli(["capture", "--model", str(model), "--text", "the cat", "--sites", "logits",
                    "--out", str(out2)]) == 0
    assert Capture.load(out2).engine == "hf"
    assert "text.zarr" in capsys.readouterr().out


def test_capture_cli_bad_ids_file(zoo, tmp_path):
    bad = tmp_path / "ids.json"
    bad.write_text("[[1, 2], [3]]")
    with pytest.raises(ValueError, match="equal-length"):
        run_cli(["capture", "--model", str(zoo("tiny-llama")), "--ids", str(bad), "--out", str(tmp_path / "x.zarr")])
